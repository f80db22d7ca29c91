"""The command line (``normcal``): the top layer, a user of the service and its parts.

``main.py`` holds the commands, ``inputs.py`` what they read, ``beir.py`` and
``evaluation.py`` the offline evaluation (``normcal eval``), ``process.py`` the
service as a subprocess. Nothing below this layer imports it.
"""
