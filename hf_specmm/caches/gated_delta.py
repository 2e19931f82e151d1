"""The maths of a Gated DeltaNet layer's states (Qwen3.5's linear attention): replaying kept tokens one decode
step at a time, the way plain ``generate`` advances them. Used by :mod:`hf_specmm.caches.linear` at rollbacks.

A layer reads its input through ``in_proj_qkv`` (-> a causal depthwise conv over the last K inputs, then query /
key / value), ``in_proj_a`` (-> the decay ``g``) and ``in_proj_b`` (-> ``beta``); a decode step updates the
recurrent state [B, H_v, D_k, D_v] (float32) with the modeling file's own single-step kernel. The kernels and
the version-dependent details come from :mod:`hf_specmm._compat`.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _compat


def replay(modules: list[Any], states: list[tuple[torch.Tensor, torch.Tensor]],
           inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
           keep: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The states of Gated DeltaNet layers after each row's kept tokens, as single decode steps compute them.

    Per layer: ``states`` (conv [B, C, K], recurrent [B, H, Dk, Dv]) before the tokens; ``inputs`` the tokens'
    ``in_proj_qkv`` [B, W, C] / ``in_proj_a`` / ``in_proj_b`` [B, W, H] outputs from the forward that read them;
    ``keep`` [B, W] bool: the tokens each row keeps (in order; the others never happened for that row). Each
    kept token is one call of the modeling module's own recurrent step (``torch_recurrent_gated_delta_rule``,
    the kernel of plain generate's decode steps) on its conv output (``causal_conv1d_fn`` over the row's last
    K kept inputs); layers of one shape take their steps together (one kernel call per step for all of them)."""
    conv_fn, step = _compat.gated_delta_kernels(modules[0])
    batch = keep.shape[0]
    counts = keep.sum(-1)
    steps = int(counts.max()) if counts.numel() else 0
    # each row's kept tokens first, in order (a stable sort): their conv windows are contiguous
    order = torch.sort((~keep).long(), dim=1, stable=True).indices
    convs, per_step = [], []
    for module, (conv, _), (qkv, a, b) in zip(modules, states, inputs):
        qkv, a, b = (x.gather(1, order.to(x.device)[..., None].expand_as(x)) for x in (qkv, a, b))
        kernel = conv.shape[-1]
        stream = torch.cat([conv, qkv.transpose(1, 2).to(conv.dtype)], dim=-1)  # [B, C, K + W]
        window = counts.to(conv.device)[:, None, None] + torch.arange(kernel, device=conv.device)
        convs.append(stream.gather(2, window.expand(batch, stream.shape[1], kernel)))
        if steps == 0:
            continue
        mixed = conv_fn(stream, module.conv1d.weight.squeeze(1), module.conv1d.bias,
                                          activation=module.activation)[:, :, kernel : kernel + steps]
        mixed = mixed.transpose(1, 2).to(qkv.dtype)
        query, key, value = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
        query = query.reshape(batch, steps, -1, module.head_k_dim)
        key = key.reshape(batch, steps, -1, module.head_k_dim)
        value = value.reshape(batch, steps, -1, module.head_v_dim)
        if not _compat.KERNEL_REPEATS_KEY_HEADS and module.num_v_heads != module.num_k_heads:
            query = query.repeat_interleave(module.num_v_heads // module.num_k_heads, dim=2)
            key = key.repeat_interleave(module.num_v_heads // module.num_k_heads, dim=2)
        g = -module.A_log.float().exp() * torch.nn.functional.softplus(a[:, :steps].float() + module.dt_bias)
        per_step.append((query, key, value, g, b[:, :steps].sigmoid()))
    if steps == 0:
        return [(conv, recurrent.clone()) for conv, (_, recurrent) in zip(convs, states)]
    recurrents = [recurrent for _, recurrent in states]
    same = len({(m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim, r.dtype, r.device)
                for m, r in zip(modules, recurrents)}) == 1
    groups = [list(range(len(modules)))] if same else [[i] for i in range(len(modules))]
    out: list[Any] = [None] * len(modules)
    for group in groups:  # one batch of B x layers rows per step
        query, key, value, g, beta = (torch.cat([per_step[i][n] for i in group]) for n in range(5))
        state = torch.cat([recurrents[i] for i in group])
        live = counts.to(state.device).repeat(len(group))
        for j in range(steps):
            one = slice(j, j + 1)
            _, stepped = step(
                query[:, one], key[:, one], value[:, one], g=g[:, one], beta=beta[:, one], initial_state=state,
                output_final_state=True, use_qk_l2norm_in_kernel=True)
            state = torch.where((live > j)[:, None, None, None], stepped.to(state.dtype), state)
        for n, i in enumerate(group):
            out[i] = (convs[i], state[n * batch : (n + 1) * batch])
    return out
