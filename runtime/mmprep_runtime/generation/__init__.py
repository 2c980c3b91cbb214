"""The generate side behind the OpenAI front: the vLLM engines a rendered request is sent to
(``engines``) and how a whole OpenAI request is carried through render, generate and derender
(``chain``)."""
