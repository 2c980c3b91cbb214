"""The ``mmprep-runtime`` commands: ``serve``, ``probe``, ``bench`` and ``calibrate`` (the last two
over the shared ``measuring``); ``mmprep_runtime.cli`` parses the command line and calls them.
"""
