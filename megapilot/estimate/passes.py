"""How the step's terms count a micro-batch's passes and the values they move, shared by step_time.py (the step's
assembly) and moe_terms.py (a MoE layer's own terms), which both price against them."""

from __future__ import annotations

ACTIVATION_BYTES = 2  # bf16 activations, K/V blocks and expert tokens on the wire
# The backward costs two forwards, so forward + backward is three: re-running a forward costs a
# third of a layer's time, and the backward is the last two thirds of a micro-batch (what the
# gradient reduction can hide under; the parameter gather hides under the forward third).
PASSES_PER_FORWARD_BACKWARD = 3
FORWARD_SHARE = 1 / 3
BACKWARD_SHARE = 2 / 3
