"""A five-document corpus with one query per document, shared by API tests."""

from __future__ import annotations

CORPUS = {
    "aspirin": "Aspirin lowers the risk of heart attack in older adults.",
    "python": "Python is a programming language with dynamic typing.",
    "paris": "Paris is the capital and largest city of France.",
    "photosynthesis": "Plants convert sunlight into chemical energy by photosynthesis.",
    "faiss": "FAISS is a library for efficient similarity search of dense vectors.",
}
QUERIES = {
    "aspirin": "Does aspirin prevent heart attacks?",
    "python": "Which programming language is dynamically typed?",
    "paris": "What is the capital of France?",
    "photosynthesis": "How do plants make energy from light?",
    "faiss": "library for nearest neighbour vector search",
}
