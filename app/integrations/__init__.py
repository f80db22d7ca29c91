"""Optional integrations with RAG frameworks.

Each lives in its own module and imports its framework there, so the service and
:mod:`app.client` never need it: ``from app.integrations.langchain import
NormcalRetriever`` needs ``pip install 'normcal[langchain]'`` (``langchain-core``).
"""

from __future__ import annotations
