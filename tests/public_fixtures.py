"""Where the real public artifacts live inside the repository (provenance in fixtures/public/README.md).

Tests and benchmarks read only files of the checkout: a user's clone has nothing beside it.
"""

from __future__ import annotations

from pathlib import Path

PUBLIC = Path(__file__).resolve().parent / "fixtures" / "public"
HTA_TRACES = PUBLIC / "traces" / "hta"
H100_INFERENCE = PUBLIC / "traces" / "tracelens_h100" / "h100_bert_small_inference__1016001.json.gz"
NVRX_GPU_ERROR_1ST = PUBLIC / "flight_recorder" / "nvrx_gpu_error_1st"
CUDA_GRAPH_TRACES = PUBLIC / "traces" / "cuda_graphs"  # kernels run by CUDA (HIP) graph launches
