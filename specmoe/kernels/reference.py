"""The reference expert operation: float64, plain loops over tokens and slots (the test oracle).

For each token t and slot j, with e = ids[t, j] (see :mod:`specmoe.kernels._contract`)::

    a = act(W_gate_up[e] x_t + b_gate_up[e])        # [I]
    y_t += weights[t, j] · (W_down[e] a + b_down[e])  # [h]

Every product is a float64 matrix-vector product; nothing is batched, grouped or fused, so the
result depends on no kernel's grouping or blocking.
"""

from __future__ import annotations

import torch

from specmoe.kernels._contract import activate, check_inputs


def expert_op(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    activation: str = "swiglu",
    b_gate_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """y [n, h] in x's dtype, computed in float64 on the CPU."""
    n, m, _, h, _ = check_inputs(
        x,
        w_gate_up,
        w_down,
        ids,
        weights,
        activation=activation,
        b_gate_up=b_gate_up,
        b_down=b_down,
    )
    d = torch.float64
    xd = x.detach().to("cpu", d)
    idl = ids.detach().to("cpu").tolist()
    wd = weights.detach().to("cpu", d)
    y = torch.zeros(n, h, dtype=d)
    for t in range(n):
        for j in range(m):
            e = idl[t][j]
            gu = w_gate_up[e].detach().to("cpu", d) @ xd[t]  # [2I]
            if b_gate_up is not None:
                gu = gu + b_gate_up[e].detach().to("cpu", d)
            out = w_down[e].detach().to("cpu", d) @ activate(gu, activation)  # [h]
            if b_down is not None:
                out = out + b_down[e].detach().to("cpu", d)
            y[t] += wd[t, j] * out
    return y.to(x.device, x.dtype)
