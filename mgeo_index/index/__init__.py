"""The index files of a catalog generation: the dense side (:mod:`~mgeo_index.index.vector_store`, the one door:
FAISS files through :mod:`~mgeo_index.index.faiss_index`, or Milvus) and the sparse side
(:mod:`~mgeo_index.index.sparse`: character n-gram TF-IDF). Generations of them are written and switched by
:mod:`mgeo_index.catalog.generations`.
"""
