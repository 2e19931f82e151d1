"""First vs repeated cost of attention at new (width, kv length) shapes on this GPU."""
import statistics, time, contextlib, sys
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = "cuda" if torch.cuda.is_available() else "cpu"
print("torch", torch.__version__, "cudnn sdp", torch.backends.cuda.cudnn_sdp_enabled(), "flash", torch.backends.cuda.flash_sdp_enabled(),
      "mem_eff", torch.backends.cuda.mem_efficient_sdp_enabled(), "math", torch.backends.cuda.math_sdp_enabled())
H, D, dt = 32, 128, torch.bfloat16
def timed(fn):
    if dev == "cuda": torch.cuda.synchronize()
    s = time.perf_counter(); fn()
    if dev == "cuda": torch.cuda.synchronize()
    return (time.perf_counter() - s) * 1e3
def sdpa_case(label, w, Ls, mask_kind, backends=None):
    first, second = [], []
    try:
        for L in Ls:
            q = torch.randn(1, H, w, D, device=dev, dtype=dt); k = torch.randn(1, H, L + w, D, device=dev, dtype=dt); v = torch.randn_like(k)
            m = torch.ones(w, L + w, dtype=torch.bool, device=dev).tril(L)[None, None]
            if mask_kind == "float": m = torch.zeros(m.shape, dtype=dt, device=dev).masked_fill(~m, torch.finfo(dt).min)
            if mask_kind == "none": m = None
            ctx = sdpa_kernel(backends) if backends else contextlib.nullcontext()
            with ctx:
                f = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                first.append(timed(f)); second.append(timed(f))
        print(f"{label:28s} w={w:3d} mask={mask_kind:5s} first med {statistics.median(first):8.3f} max {max(first):8.3f} | again med {statistics.median(second):7.3f} ms")
    except Exception as e:
        print(f"{label:28s} w={w:3d} mask={mask_kind:5s} error: {type(e).__name__}: {str(e)[:150]}")
Ls = list(range(600, 624))
for w in (1, 4, 17, 65):
    for mk in ("bool", "float"):
        sdpa_case("default", w, [L + 100 * w for L in Ls], mk)
sdpa_case("default", 4, [L + 5000 for L in Ls], "none")
for name, b in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH), ("flash", SDPBackend.FLASH_ATTENTION)):
    sdpa_case(name, 17, [L + 3000 + 50 * hash(name) % 500 for L in Ls], "bool", [b])
torch.backends.cuda.enable_cudnn_sdp(False)
for w in (4, 17):
    sdpa_case("cudnn disabled", w, [L + 7000 + 100 * w for L in Ls], "bool")
torch.backends.cuda.enable_cudnn_sdp(True)
# a 2-layer 7B-wide Llama through transformers (sdpa), a forward of w tokens after a cache of L: first vs again
from transformers import LlamaConfig, LlamaForCausalLM, DynamicCache
cfg = LlamaConfig(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=32)
model = LlamaForCausalLM(cfg).to(dev, dt).eval()
print("attn", model.config._attn_implementation)
def model_case(label, w, tree):
    ids = torch.randint(3, 32000, (1, 900), device=dev)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model(input_ids=ids[:, :600], past_key_values=cache, use_cache=True)
        first, second = [], []
        for L in range(600, 624):
            cache.crop(L)
            x = ids[:, L:L + w]
            kw = {}
            if tree:
                m = torch.ones(w, L + w, dtype=torch.bool, device=dev).tril(L)[None, None]
                kw = {"attention_mask": torch.zeros(m.shape, dtype=dt, device=dev).masked_fill(~m, torch.finfo(dt).min)}
            pos = torch.arange(L, L + w, device=dev)[None]
            f = lambda: model(input_ids=x, past_key_values=cache, use_cache=True, position_ids=pos, cache_position=pos[0], **kw)
            first.append(timed(f)); cache.crop(L); second.append(timed(f))
    print(f"{label:28s} w={w:3d} first med {statistics.median(first):8.3f} max {max(first):8.3f} | again med {statistics.median(second):7.3f} ms")
for w in (1, 4, 17):
    for tree in (False, True):
        try: model_case(f"llama2L tree_mask={tree}", w, tree)
        except Exception as e: print("model case error", w, tree, type(e).__name__, str(e)[:200])
torch.backends.cuda.enable_cudnn_sdp(False)
for w in (4, 17):
    model_case("llama2L cudnn off, tree mask", w, True)
