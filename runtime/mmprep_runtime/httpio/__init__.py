"""HTTP I/O shared by the APIs and the backends: request bodies read under the limits and
answers written in pieces (``messages``), media fetched under mmprep's URL rules (``fetching``)."""
