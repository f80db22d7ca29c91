"""Collections: SQLite store (the truth), FAISS index (derived), and their registry."""
