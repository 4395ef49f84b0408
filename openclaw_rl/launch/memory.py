"""Long samples in the launch plan: Megatron's tensor and context parallelism and Slime's dynamic batching
(``--tensor-model-parallel-size``, ``--context-parallel-size``, ``--max-tokens-per-gpu``), chosen from the
context length and the GPU memory, with the arithmetic printed in the dry run.

Stage: engine (trainer sizing, before launch). Why: upstream hard-coded context parallelism 1 and 32768 tokens
per GPU, and its users ran out of memory at 14-17K-token samples on 80 GB GPUs (upstream issue #52); an
OpenClaw turn is 15-25K tokens (its system prompt alone is several thousand). Slime packs samples into
micro-batches of at most ``max_tokens_per_gpu x context_parallel_size`` tokens (``slime/utils/dp_schedule.py``;
a longer sample goes alone), and context parallelism splits each sample over CP ranks.

The estimate (bytes per GPU, an upper-bound style model, not a measurement; docs/deployment.md "Memory"):

* static: parameters in bf16 (2 B) and their fp32 main gradients (4 B), split by TP. Adam's states and the fp32
  master weights live in host memory (the scripts pass ``--optimizer-cpu-offload``);
* reserve: 6 GiB for the CUDA context, NCCL buffers and allocator fragmentation;
* per token (split by TP; a GPU holds ``max_tokens_per_gpu`` tokens): the layer inputs Megatron's full
  recomputation keeps (2 B x hidden x layers), one layer's recomputed activations (34 B x hidden, Korthikanti et
  al.'s count without the attention scores), and the output layer's logits with their fp32 log-softmax,
  softmax, entropy and gradient copies (24 B x vocabulary);
* attention scores of the longest sample, should attention not run fused (upstream #52 failed exactly there,
  in TransformerEngine's softmax): one layer's (S / CP)^2 x heads / TP x 6 B (bf16 scores, fp32 softmax).
* the in-trainer teacher (``OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=trainer``, ``slime_hooks/trainer_teacher.py``):
  a whole frozen bf16 HF copy on every actor GPU (params x 2 B, no gradients or optimizer, not split by TP: the
  hook loads the whole model on each rank), and its no-grad forward of the longest sample, one sample and one
  layer at a time (not split by TP or CP): 2 B x (3 x hidden + 4 x heads x kv_channels + 3 x ffn) per token
  (residual, normed input, attention output; q, k and v repeated to every head, attention result; the MLP's
  gate, up and product) plus the R + 1 kept rows' logits, R up to ``--rollout-max-response-len`` (8192), at
  12 B per vocabulary entry (fp32 logits, their temperature-scaled copy, the log-softmax). That forward runs
  in a hook before the training pass, so the total takes the larger of it and the training activations;
  the few tokens of the hint are not counted. With context parallelism every CP rank gathers the packed
  teacher prompt and scores the whole sequence, so neither the copy nor its forward shrinks with CP.

The usable memory is 90 % of ``GPU_MEMORY_GB``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GIB = 1024**3
RESERVE = 6 * GIB
USABLE = 0.90
LOGIT_BYTES = 24  # per token and vocabulary entry (bf16 logits + fp32 copies and gradient)
LAYER_BYTES = 34  # per token and hidden unit: one recomputed layer (without the attention scores)
SCORE_BYTES = 6  # per attention score: bf16 score + fp32 softmax
CP_CHOICES = (1, 2, 4, 8)
TEACHER_WEIGHT_BYTES = 2  # the in-trainer teacher's bf16 weights, per parameter (a whole copy per actor GPU)
TEACHER_LOGIT_BYTES = 12  # per kept response row and vocabulary entry: fp32 logits, / T copy, log-softmax
MAX_RESPONSE_TOKENS = 8192  # --rollout-max-response-len (slime_args): the teacher's kept rows per sample


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    kv_channels: int
    vocab: int

    @property
    def params(self) -> int:
        """Parameters, embeddings untied (an upper bound for a model that ties them)."""
        q = self.heads * self.kv_channels
        attention = self.hidden * (q + 2 * self.groups * self.kv_channels) + q * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.ffn) + 2 * self.vocab * self.hidden


def shape_from_args(margs: Sequence[str]) -> ModelShape | None:
    """The shape Megatron is given (the scripts' model args or ``MODEL_ARGS_FILE``); None when incomplete."""
    flags = dict(zip(margs, margs[1:]))
    try:
        hidden, heads = int(flags["--hidden-size"]), int(flags["--num-attention-heads"])
        groups = int(flags.get("--num-query-groups", "1")) if "--group-query-attention" in margs else heads
        return ModelShape(layers=int(flags["--num-layers"]), hidden=hidden, ffn=int(flags.get("--ffn-hidden-size",
                          4 * hidden)), heads=heads, groups=groups,
                          kv_channels=int(flags.get("--kv-channels", hidden // heads)), vocab=int(flags["--vocab-size"]))
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Estimate:
    """The bytes of one actor GPU at tensor parallelism ``tp`` and context parallelism ``cp``."""

    shape: ModelShape
    tp: int
    cp: int
    gpu_bytes: int
    teacher: bool = False  # the in-trainer teacher's copy and forward (module docstring)

    @property
    def budget(self) -> float:
        return self.gpu_bytes * USABLE

    @property
    def static(self) -> float:
        return self.shape.params * 6 / self.tp

    @property
    def per_token(self) -> float:
        s = self.shape
        return (2 * s.hidden * s.layers + LAYER_BYTES * s.hidden + LOGIT_BYTES * s.vocab) / self.tp

    def scores(self, sample: int) -> float:
        return SCORE_BYTES * self.shape.heads / self.tp * math.ceil(sample / self.cp) ** 2

    @property
    def teacher_weights(self) -> float:
        """The in-trainer teacher's whole bf16 copy (0 without it): not split by TP."""
        return self.shape.params * TEACHER_WEIGHT_BYTES if self.teacher else 0.0

    @property
    def teacher_per_token(self) -> float:
        s = self.shape
        return 2 * (3 * s.hidden + 4 * s.heads * s.kv_channels + 3 * s.ffn)

    def teacher_rows(self, sample: int) -> int:
        return min(MAX_RESPONSE_TOKENS, sample) + 1

    def teacher_forward(self, sample: int) -> float:
        """The teacher's no-grad forward of one whole sample (0 without it): not split by TP or CP."""
        if not self.teacher:
            return 0.0
        return self.teacher_per_token * sample + self.teacher_rows(sample) * self.shape.vocab * TEACHER_LOGIT_BYTES

    def total(self, sample: int, tokens_per_gpu: int) -> float:
        training = self.per_token * tokens_per_gpu + self.scores(sample)
        return self.static + RESERVE + self.teacher_weights + max(training, self.teacher_forward(sample))

    def fits(self, sample: int) -> bool:
        """A sample of ``sample`` tokens alone in a micro-batch (S / CP tokens on each GPU)."""
        return self.total(sample, math.ceil(sample / self.cp)) <= self.budget

    def longest(self) -> int:
        """The longest sample that fits alone, in tokens (0: not even the static part fits)."""
        lo, hi = 0, 1 << 22
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.fits(mid) else (lo, mid - 1)
        return lo

    def tokens_per_gpu(self, sample: int, cap: int) -> int:
        """``--max-tokens-per-gpu``: what fits beside the longest sample's scores, in steps of 1024, at least the
        longest sample's share (S / CP, which Slime would run alone anyway) and at most ``cap``."""
        room = (self.budget - self.static - RESERVE - self.teacher_weights - self.scores(sample)) / self.per_token
        return max(min(cap, int(room // 1024 * 1024)), math.ceil(sample / self.cp / 1024) * 1024, 1024)


@dataclass(frozen=True)
class Choice:
    tp: int
    cp: int
    max_tokens_per_gpu: int
    estimate: Estimate | None  # None: the shape is unknown (nothing estimated)
    lines: tuple[str, ...]  # the printed arithmetic
    warning: str = ""


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def choose(shape: ModelShape | None, *, actor_gpus: int, context: int, gpu_gb: float, tp: int | None,
           cp: int | None, max_tokens: int | None, tp_default: int, node_gpus: Sequence[int] = (),
           teacher: bool = False) -> Choice:
    """TP (unless set), CP (unless set) and max tokens per GPU (unless set) for samples up to ``context``
    tokens: the default TP with CP 1 when that fits; else the pair (TP x CP dividing the actor GPUs, TP
    dividing the heads and query groups and, over several nodes, each node's Ray GPUs ``node_gpus``, so that no TP
    group spans nodes) that fits the longest sample, fewest CP ranks first. ``teacher``: the in-trainer
    teacher's copy and forward are counted (neither shrinks with TP or CP)."""
    if shape is None:
        t, c = tp or tp_default, cp or 1
        return Choice(t, c, max_tokens or context, None, ("# memory: model shape unknown (no --num-layers/--hidden-size/"
                      "--num-attention-heads/--vocab-size in the model args): no estimate; CONTEXT_PARALLEL and "
                      "MAX_TOKENS_PER_GPU as set or their defaults",))
    gpu = int(gpu_gb * 1e9)
    tps = [tp] if tp else [t for t in (1, 2, 4, 8) if t <= actor_gpus and not shape.heads % t and not shape.groups % t
                           and not any(n % t for n in node_gpus)]
    pairs = [(t, c) for t in tps for c in ([cp] if cp else CP_CHOICES) if actor_gpus % (t * c) == 0]
    if not pairs:
        t, c = tp or tp_default, cp or 1
        pairs = [(t, c)]
    default = (tp or tp_default, cp or 1) if (tp or tp_default) in tps else (max(tps, default=1), cp or 1)
    estimates = {p: Estimate(shape, p[0], p[1], gpu, teacher) for p in pairs}
    if default in estimates and estimates[default].fits(context):
        picked = default
    else:
        fitting = [p for p in pairs if estimates[p].fits(context)]
        picked = (min(fitting, key=lambda p: (p[1], -p[0])) if fitting
                  else max(pairs, key=lambda p: (estimates[p].longest(), -p[1])))
    e = estimates[picked]
    mt = max_tokens or e.tokens_per_gpu(context, context)
    total = e.total(context, max(mt, math.ceil(context / e.cp)))
    s = shape
    lines = (
        f"# memory per actor GPU (estimate, GPU_MEMORY_GB={gpu_gb:g}: budget 90% = {_gb(e.budget)}): model "
        f"{s.params / 1e9:.2f}B params ({s.layers} layers, hidden {s.hidden}, {s.heads} heads, vocab {s.vocab})",
        f"#   static   = params x 6 B (bf16 weights + fp32 grads; Adam on CPU) / TP {e.tp} = {_gb(e.static)}; "
        f"reserve {_gb(RESERVE)}",
        f"#   per token = (2 B x {s.hidden} x {s.layers} layers + {LAYER_BYTES} B x {s.hidden} + {LOGIT_BYTES} B x "
        f"{s.vocab} vocab) / TP {e.tp} = {e.per_token / 1e6:.3f} MB; x max(MAX_TOKENS_PER_GPU {mt}, CONTEXT_LENGTH / "
        f"CP) = {_gb(e.per_token * max(mt, math.ceil(context / e.cp)))}",
        f"#   scores   = {SCORE_BYTES} B x {s.heads} heads / TP {e.tp} x (CONTEXT_LENGTH {context} / CP {e.cp})^2 = "
        f"{_gb(e.scores(context))} (one layer, unfused attention)",
        *(() if not teacher else (
            f"#   teacher  = params x {TEACHER_WEIGHT_BYTES} B (in-trainer teacher: a whole bf16 copy on every actor "
            f"GPU, no grads/optimizer, not split by TP) = {_gb(e.teacher_weights)}; its forward of the longest sample "
            f"(not split by TP or CP) = 2 B x (3 x {s.hidden} + 4 x {s.heads} x {s.kv_channels} + 3 x {s.ffn}) x "
            f"{context} tokens + (min({MAX_RESPONSE_TOKENS}, {context}) + 1) rows x {s.vocab} vocab x "
            f"{TEACHER_LOGIT_BYTES} B = {_gb(e.teacher_forward(context))}, before the training pass: the total "
            f"takes the larger of it and tokens + scores",)),
        f"#   total    = {_gb(total)} of {_gb(e.budget)}: {'fits' if total <= e.budget else 'DOES NOT FIT'}; "
        f"longest sample that fits at TP {e.tp} x CP {e.cp}: {e.longest()} tokens; a micro-batch packs up to "
        f"MAX_TOKENS_PER_GPU x CP = {mt * e.cp} tokens",
    )
    warning = "" if total <= e.budget else (
        f"estimated {_gb(total)} per actor GPU at TP {e.tp} x CP {e.cp} for CONTEXT_LENGTH={context} exceeds 90% of "
        f"GPU_MEMORY_GB={gpu_gb:g}: samples longer than about {e.longest()} tokens may run out of memory. " + (
            "The in-trainer teacher adds a whole copy and a whole-sample forward on every actor GPU: lower "
            "CONTEXT_LENGTH, add actor GPUs, or use the teacher server" if teacher else
            "Add actor GPUs (more CP ranks), lower CONTEXT_LENGTH or MAX_TOKENS_PER_GPU"))
    return Choice(e.tp, e.cp, mt, e, lines, warning)
