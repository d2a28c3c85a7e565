"""The answer cache: an exact layer and a semantic one (FAISS over the embedding model), with the
pair model and lexical vetoes deciding a semantic hit (docs/cache.md)."""
