"""How the networks run: the one batching engine (:mod:`~mgeo_index.runtime.inference`: tokenize, length-sorted
batches, FP16 on CUDA), the CPU backends (:mod:`~mgeo_index.runtime.backends`: int8 and bf16 Linear layers in
:mod:`~mgeo_index.runtime.quant`, attention whose result does not depend on the batch in
:mod:`~mgeo_index.runtime.attention`), the row kernels behind one dispatch point (:mod:`~mgeo_index.runtime.kernels`,
the Triton ones in :mod:`~mgeo_index.runtime.triton_kernels`) and batches computed side by side on CPU threads
(:mod:`~mgeo_index.runtime.parallel`). The models themselves are in :mod:`mgeo_index.model`.
"""
