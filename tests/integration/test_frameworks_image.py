"""PyPI's default `sentence-transformers` (torch with its CUDA wheels) built, verified and run.

One CLI run plans, builds and verifies the set for amd64 on the reference base (about 3 GB of
wheels, a 6.3 GB image, each removed once the module ends). Then a hardened sandbox (uid 65532,
read-only root, no capabilities, no network, HF_HUB_OFFLINE=1) makes a small BERT sentence
model in its workspace, with a vocabulary it writes itself (nothing from the hub), and a second
sandbox loads it from there and embeds sentences: what a user's evaluator does, on a CPU node
with no NVIDIA driver.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.images import HARDENED, Built, build, docker
from support.machine import SESSION

pytestmark = pytest.mark.usefixtures("docker_client", "package_index")

REQUIREMENTS = "sentence-transformers\n"
TAG = f"bsi-frameworks/sentence-transformers-{SESSION}:test"
HIDDEN = 32  # the model's width: every embedding has this many numbers

# Run in the image: a WordPiece vocabulary of a few hundred entries, a 2-layer BERT of width 32
# saved with save_pretrained, wrapped as a SentenceTransformer (Transformer + mean Pooling) and
# saved; it prints how the tokenizer splits a sentence and that sentence's embedding.
MAKE_MODEL = f"""
import json, os, string, sys
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
from transformers import BertConfig, BertModel, BertTokenizerFast

root = sys.argv[1]
torch.manual_seed(0)
words = "the sentence sandbox model runs small read only root network embedding".split()
pieces = [a + b for a in "aeiou" for b in string.ascii_lowercase]
subwords = [*string.ascii_lowercase, *string.digits, *pieces]
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *subwords,
         *("##" + piece for piece in subwords)]
os.makedirs(root + "/bert")
with open(root + "/bert/vocab.txt", "w") as file:
    file.write("\\n".join(vocab) + "\\n")
tokenizer = BertTokenizerFast.from_pretrained(root + "/bert")  # reads vocab.txt
tokenizer.save_pretrained(root + "/bert")
config = BertConfig(vocab_size=len(vocab), hidden_size={HIDDEN}, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
BertModel(config).save_pretrained(root + "/bert")
modules = [Transformer(root + "/bert", max_seq_length=32), Pooling({HIDDEN}, "mean")]
model = SentenceTransformer(modules=modules, device="cpu")
model.save(root + "/sentence-model")
print(json.dumps({{"vocab": len(vocab), "tokenizer": len(tokenizer),
                  "tokens": tokenizer.tokenize("a sentence runs quietly"),
                  "embedding": model.encode(["a sentence"])[0].tolist()}}))
"""

# Run in a fresh sandbox: the saved model loaded from the workspace, two sentences embedded.
LOAD_MODEL = """
import json, os, sys
import torch
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(sys.argv[1], device="cpu")
embeddings = model.encode(["a sentence", "the sandbox runs a small model"])
print(json.dumps({"uid": os.getuid(), "shape": list(embeddings.shape),
                  "embeddings": embeddings.tolist(), "cuda_build": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available()}))
"""


@pytest.fixture(scope="module")
def built(
    reference_image: str,
    test_env: dict,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Built]:
    """One CLI run: plan, build and verify the set for amd64 with a cache of its own (no other
    test of the run builds torch); the image, its build context and that cache (gigabytes of
    layers and wheels each) removed afterwards."""
    tmp_path = tmp_path_factory.mktemp("frameworks")
    cache = tmp_path / "cache"
    result = build(tmp_path, cache, reference_image, REQUIREMENTS, TAG, "--arch", "amd64")
    report_path = tmp_path / "context" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    yield Built(TAG, result, report)
    docker(test_env, "rmi", "-f", TAG, check=False)
    shutil.rmtree(tmp_path / "context", ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)


def sandboxed(test_env: dict, workspace: Path, code: str, *args: str) -> dict:
    """`code` run as the sandbox would run it, the workspace mounted writable; its last line of
    output, a JSON object."""
    result = docker(
        test_env, "run", "--rm", *HARDENED, "--volume", f"{workspace}:/workspace",
        "--env", "HF_HUB_OFFLINE=1", "--entrypoint", "python3", TAG, "-c", code, *args,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_the_default_set_builds_and_verifies_hardened(built: Built) -> None:
    assert built.result.returncode == 0, built.result.stdout[-3000:] + built.result.stderr
    verification = built.report["image"]["verification"]
    assert verification["passed"] is True
    names = {check["name"] for check in verification["checks"]}
    assert "import sentence_transformers" in names  # the import of what the user asked for
    assert "PASS  import sentence_transformers" in built.result.stdout
    assert not [line for line in built.result.stdout.splitlines() if line.startswith("FAIL")]


def test_the_image_holds_pypis_cuda_wheels(built: Built, test_env: dict, tmp_path: Path) -> None:
    """PyPI's default torch is the CUDA build: its NVIDIA wheels are in the plan and the image,
    the driver is not, and torch imports and computes on a node with no GPU."""
    assert built.result.returncode == 0, built.result.stderr
    packages = {p["name"]: p for p in built.report["architectures"]["amd64"]["packages"]}
    nvidia = sorted(name for name in packages if name.startswith("nvidia-"))
    assert any(name.startswith("nvidia-cublas") for name in nvidia), sorted(packages)
    assert "+cpu" not in packages["torch"]["version"]
    found = sandboxed(test_env, tmp_path, f"""
import ctypes.util, importlib.metadata, json, torch
names = {nvidia!r}
print(json.dumps({{"versions": [importlib.metadata.version(n) for n in names],
                  "cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
                  "sum": torch.ones(3, 3).sum().item(),
                  "driver": ctypes.util.find_library("cuda")}}))
""")  # fmt: skip
    assert found["versions"] == [packages[name]["version"] for name in nvidia]
    assert found["cuda_build"] and found["cuda_available"] is False
    assert found["sum"] == 9.0
    # the NVIDIA driver's library: the plan names it the GPU node's, and the image has none
    node = built.report["architectures"]["amd64"]["provided_by_gpu_node"]
    assert "libcuda.so.1" in {library["soname"] for library in node}
    assert found["driver"] is None


def test_a_model_made_in_the_sandbox_embeds_offline_read_only(
    built: Built, test_env: dict, sandbox_workspace: Path
) -> None:
    """Made in one sandbox, loaded from the workspace in another: the same embedding for the
    same sentence, of the model's width, different for another sentence."""
    assert built.result.returncode == 0, built.result.stderr
    made = sandboxed(test_env, sandbox_workspace, MAKE_MODEL, "/workspace/tiny")
    assert 200 <= made["vocab"] <= 400 and made["tokenizer"] == made["vocab"]
    assert "[UNK]" not in made["tokens"] and made["tokens"][:3] == ["a", "sentence", "runs"]
    saved = sandbox_workspace / "tiny" / "sentence-model"
    assert (saved / "modules.json").is_file() and (saved / "model.safetensors").is_file()
    loaded = sandboxed(test_env, sandbox_workspace, LOAD_MODEL, "/workspace/tiny/sentence-model")
    assert loaded["uid"] == 65532
    assert loaded["shape"] == [2, HIDDEN]
    first, second = loaded["embeddings"]
    assert first == pytest.approx(made["embedding"], abs=1e-5)
    assert second != pytest.approx(first, abs=1e-3)
    assert loaded["cuda_build"] and loaded["cuda_available"] is False
