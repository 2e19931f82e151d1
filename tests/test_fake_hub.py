"""The offline Hub stand-ins of ``fake_hub`` drive the real huggingface_hub / transformers client code paths."""

from __future__ import annotations

import http.client
import socket

import pytest
import torch
from fake_hub import FakeHub, populate_hf_cache, run_python
from fake_hub_fixtures import fake_hub  # noqa: F401 - pytest fixture
from transformers import LlamaConfig, LlamaForCausalLM

INPUT_IDS = [[1, 5, 9, 13, 2, 7, 63, 0]]
CARD = "---\nlicense: mit\ntags:\n- fake-hub\n---\n\n# tiny-pushed\n\nA tiny test model.\n"

# Loads `repo` in the child and dumps its logits; single-threaded like the parent so results are bit-identical.
LOAD_AND_DUMP = """
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)
model = AutoModelForCausalLM.from_pretrained({repo!r}).eval()
with torch.no_grad():
    torch.save(model(torch.tensor({ids!r})).logits, {out!r})
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama saved with save_pretrained, and its reference logits on INPUT_IDS."""
    folder = tmp_path_factory.mktemp("tiny") / "saved"
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(torch.tensor(INPUT_IDS)).logits
    return folder, logits


def test_populated_cache_resolves_offline(tiny, tmp_path):
    folder, logits = tiny
    cache = tmp_path / "hub"
    sha = populate_hf_cache(cache, "org/tiny", folder)
    assert (cache / "models--org--tiny" / "refs" / "main").read_text() == sha
    out = tmp_path / "logits.pt"
    code = LOAD_AND_DUMP.format(repo="org/tiny", ids=INPUT_IDS, out=str(out)) + f"""
from pathlib import Path
from huggingface_hub import constants, hf_hub_download
from transformers import AutoConfig
assert constants.HF_HUB_OFFLINE
path = Path(hf_hub_download("org/tiny", "config.json"))
assert path.parent.name == {sha!r} and path.is_symlink(), path
assert AutoConfig.from_pretrained("org/tiny").hidden_size == 32
"""
    run_python(code, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)})
    assert torch.equal(torch.load(out), logits)


def test_push_to_fake_hub_and_download_back(tiny, tmp_path, fake_hub):  # noqa: F811
    folder, logits = tiny
    hub = fake_hub
    push = f"""
from huggingface_hub import upload_file
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(folder)!r})
model.push_to_hub("org/tiny-pushed", token="fake")
upload_file(path_or_fileobj={CARD.encode()!r}, path_in_repo="README.md", repo_id="org/tiny-pushed", token="fake")
"""
    # ModelCard.push_to_hub would work too on huggingface_hub 2.x, but 1.x validates the card against a hard-coded
    # https://huggingface.co/api/validate-yaml: upload_file goes through the same create_commit path on both.
    run_python(push, {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "pusher")})
    files = hub.repos["org/tiny-pushed"]
    assert {"config.json", "model.safetensors", "README.md"} <= set(files)
    assert files["README.md"] == CARD.encode()
    assert "POST /api/models/org/tiny-pushed/commit/main" in hub.requests

    out = tmp_path / "logits.pt"
    load = LOAD_AND_DUMP.format(repo="org/tiny-pushed", ids=INPUT_IDS, out=str(out)) + f"""
from huggingface_hub import ModelCard
card = ModelCard.load("org/tiny-pushed")
assert card.data.license == "mit" and card.data.tags == ["fake-hub"], card.data
assert str(card) == {CARD!r}, str(card)
"""
    run_python(load, {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "loader")})
    assert torch.equal(torch.load(out), logits)
    assert any("/resolve/" in r and r.startswith("GET ") for r in hub.requests)
    assert hub.unhandled == []


def test_fake_hub_logs_unknown_routes_and_stops():
    with FakeHub() as hub:
        port = int(hub.endpoint.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/api/spaces/org/x")
        assert conn.getresponse().status == 404
        conn.close()
        assert hub.unhandled == ["GET /api/spaces/org/x"]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
