"""Long samples in the launch plan: Megatron's tensor and context parallelism and Slime's dynamic batching
(``--tensor-model-parallel-size``, ``--context-parallel-size``, ``--max-tokens-per-gpu``), chosen from the
context length and the GPU memory, with the arithmetic printed in the dry run.

Stage: engine (trainer sizing, before launch). Why: an OpenClaw turn is 15-25K tokens (its system prompt alone
is several thousand), and a plan that does not fit fails minutes into a launch. Slime packs samples into
micro-batches of at most ``max_tokens_per_gpu x context_parallel_size`` tokens (``slime/utils/dp_schedule.py``;
a longer sample goes alone), and context parallelism splits each sample over CP ranks.

The estimate (bytes per actor GPU, an upper-bound style model, not a measurement; docs/deployment.md "Long
samples"). Each term follows a flag the scripts pass (launch/slime_args.py) and the code it runs:

* static: parameters in bf16 (2 B) and their fp32 main gradients (4 B, ``--accumulate-allreduce-grads-in-fp32``),
  split by TP. The fp32 master weights and Adam's states live in host memory: ``--optimizer-cpu-offload`` with
  ``--use-precision-aware-optimizer`` (Megatron's hybrid device optimizer; ``--optimizer-offload-fraction``
  defaults to 1.0, all of it);
* reserve: 6 GiB for the CUDA context, NCCL buffers and allocator fragmentation;
* per token (a GPU holds ``max(max_tokens_per_gpu, S / CP)`` tokens), split by TP:
  - the layer inputs that full recomputation keeps (``--recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1``: one bf16 hidden state per layer, sequence-parallel so split by TP):
    2 B x hidden x layers;
  - the one layer being recomputed: its saved activations, 2 B x (4 x hidden + 3 x q + 3 x kv + 2 x heads +
    3 x ffn) with q = heads x kv_channels and kv = query groups x kv_channels (the two norms' inputs and
    outputs; q and k before and after their norm, and v; flash attention's output and its fp32 log-sum-exp
    per head; the MLP's gate, up and product), and as many bytes again for their gradients during its
    backward (Korthikanti et al.'s 34 B x hidden counts a GeLU 4h MLP with dropout masks, not this shape);
  - the output layer's logits, 4 B + 8 B x passes per vocabulary entry: Megatron's Float16Module hands the
    loss fp32 logits (THUDM/slime's ``get_log_probs_and_entropy`` asserts float32; the bundled Slime keeps
    bf16, fewer bytes), and each log-softmax pass the loss keeps for backward costs 8 B per row: Slime's
    own policy loss divides all the logits by the temperature (a copy) and ``_VocabParallelLogProbEntropy``
    saves each ``--log-probs-chunk-size`` chunk's fp32 softmax (entropy without a gradient:
    ``--entropy-coef 0.00``); this project's losses (``openclaw_rl/losses/logprobs.py``) keep 4 B, one fp32
    tensor per pass (the log-softmax on one device, which its gather saves too; under TP the exponential of
    the shifted shard, the K entries being picked by indexing, whose backward keeps only the indices; the
    temperature copy is not saved, and with ``--entropy-coef`` 0 the entropy keeps nothing), but are counted
    at the same 8 B, an upper bound (a tighter 4 B would change the chosen TP / CP of some plans, e.g. the
    OEL script's TP 2 to TP 1 at 71.9 of 72 GB, which no GPU run has checked). One pass; two for
    ``topk_select`` (its GRPO half and its top-K half). No 24 B fp32 log-softmax/softmax/entropy/gradient
    stack: chunked, in place;
* per sample, for this project's own losses: the temperature copy of one sample's response rows (4 B per row
  up to ``--rollout-max-response-len`` (8192) and vocabulary entry; division by a number keeps nothing for
  backward, so it lives for that sample only) and, in the shared PPO loss (``combine``, ``topk_select``), its
  detached entropy (``--entropy-coef 0.00``), computed in chunks of ``ENTROPY_CHUNK_ROWS`` (1024) rows
  (``openclaw_rl/losses/logprobs.py``): two fp32 temporaries per chunk row and vocabulary entry (the clamped
  log-probs and their exponential; under TP the shifted shard and its exponential), 8 B x min(rows, 1024), not
  the whole response's rows. All split by TP;
* no attention scores: the scripts pass ``--attention-backend flash``, for which Megatron's
  ``LanguageModule._set_attention_backend`` sets ``NVTE_FLASH_ATTN=1 NVTE_FUSED_ATTN=0 NVTE_UNFUSED_ATTN=0``,
  so TransformerEngine never runs its unfused attention (which materialises the (S / CP)^2 x heads scores)
  and raises instead of falling back to it. Upstream #52 ran out of memory in exactly that unfused softmax at
  14-17K tokens: its scripts passed ``--megatron-to-hf-mode bridge``, whose model provider then set only the
  parallel sizes, not ``--attention-backend`` nor the recompute flags (left at Megatron's defaults: auto, which
  allows the unfused path, and no recomputation); the fork ngquochuy0101/OpenClaw-RL forwards them since
  177747e (2026-04-21) for that reason. Slime's raw path, which these scripts use, applies both. An extra ``--attention-backend unfused`` (or ``local``, or ``auto``, which allows the unfused path) brings the
  scores back into the estimate:
  one layer's (S / CP)^2 x heads / TP x 6 B (bf16 scores, fp32 softmax);
* a custom layer spec (``--spec``, e.g. Qwen3.5's ``slime_plugins.models.qwen3_5``) can run whole-sequence
  Hugging Face attention on every rank (Slime's ``hf_attention.py`` gathers the sequence over TP and CP): its
  recomputed layer is counted for the whole sample, split by neither TP nor CP;
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

Small and not counted: the teacher's top-K tensors of the top-K losses (K x (4 + 8) B per response token:
about 5 MB for 8192 tokens at K = 50), the per-token log-probs and advantages, Slime's weight-update buckets.
The usable memory is 90 % of ``GPU_MEMORY_GB``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

GIB = 1024**3
RESERVE = 6 * GIB
USABLE = 0.90
LOGIT_BYTES = 4  # per token and vocabulary entry: the fp32 logits the loss gets
PASS_BYTES = 8  # per token and vocabulary entry, for each log-softmax pass the loss keeps for backward
LAYER_GRAD_FACTOR = 2  # the recomputed layer's activations, and as many bytes again for their gradients
SCORE_BYTES = 6  # per attention score, unfused attention only: bf16 score + fp32 softmax
# --attention-backend values that may materialise the scores: auto (Megatron's default) sets none of NVTE_*_ATTN,
# so TransformerEngine falls back to its unfused attention where flash and fused do not apply (upstream #52)
UNFUSED_BACKENDS = ("unfused", "local", "auto")
CP_CHOICES = (1, 2, 4, 8)
TEACHER_WEIGHT_BYTES = 2  # the in-trainer teacher's bf16 weights, per parameter (a whole copy per actor GPU)
TEACHER_LOGIT_BYTES = 12  # per kept response row and vocabulary entry: fp32 logits, / T copy, log-softmax
MAX_RESPONSE_TOKENS = 8192  # --rollout-max-response-len (slime_args): the response rows of one sample
ENTROPY_CHUNK_ROWS = 1024  # openclaw_rl/losses/logprobs.py ENTROPY_CHUNK_ROWS: rows per detached-entropy chunk
ENTROPY_CHUNK_BYTES = 8  # per chunk row and vocabulary entry: two fp32 temporaries (logprobs._detached_entropy)


@dataclass(frozen=True)
class LossShape:
    """What the training loss keeps beside the logits (module docstring): ``passes`` log-softmax passes kept
    for backward (8 B each per token and vocabulary entry), ``sample_bytes`` per response row and
    vocabulary entry of the one sample this project's losses work on at a time, and ``chunk_bytes`` per row
    of one detached-entropy chunk (at most ``ENTROPY_CHUNK_ROWS``) and vocabulary entry."""

    passes: int = 1
    sample_bytes: int = 0
    name: str = "Slime's policy loss"
    chunk_bytes: int = 0


SLIME_LOSS = LossShape()
PPO_LOSS = LossShape(1, 4, "the shared PPO loss (combine)", ENTROPY_CHUNK_BYTES)
TOPK_LOSS = LossShape(1, 4, "the top-K OPD loss")
TOPK_SELECT_LOSS = LossShape(2, 4, "the top-K select loss (GRPO + top-K)", ENTROPY_CHUNK_BYTES)


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    kv_channels: int
    vocab: int
    custom_spec: bool = False  # --spec: attention may run whole-sequence on every rank (module docstring)

    @property
    def params(self) -> int:
        """Parameters, embeddings untied (an upper bound for a model that ties them)."""
        q = self.heads * self.kv_channels
        attention = self.hidden * (q + 2 * self.groups * self.kv_channels) + q * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.ffn) + 2 * self.vocab * self.hidden

    @property
    def layer_units(self) -> int:
        """2-byte units one recomputed layer saves per token (module docstring)."""
        q, kv = self.heads * self.kv_channels, self.groups * self.kv_channels
        return 4 * self.hidden + 3 * q + 3 * kv + 2 * self.heads + 3 * self.ffn


def shape_from_args(margs: Sequence[str]) -> ModelShape | None:
    """The shape Megatron is given (the scripts' model args or ``MODEL_ARGS_FILE``); None when incomplete."""
    flags = dict(zip(margs, margs[1:]))
    try:
        hidden, heads = int(flags["--hidden-size"]), int(flags["--num-attention-heads"])
        groups = int(flags.get("--num-query-groups", "1")) if "--group-query-attention" in margs else heads
        return ModelShape(layers=int(flags["--num-layers"]), hidden=hidden, ffn=int(flags.get("--ffn-hidden-size",
                          4 * hidden)), heads=heads, groups=groups,
                          kv_channels=int(flags.get("--kv-channels", hidden // heads)), vocab=int(flags["--vocab-size"]),
                          custom_spec="--spec" in margs)
    except (KeyError, ValueError):
        return None


def attention_backend(argv: Sequence[str]) -> str:
    """The ``--attention-backend`` that Slime's trainer would read from ``argv``, "" when none. Slime parses it
    with Megatron's parser (``megatron.training.arguments.parse_args``: ``allow_abbrev=False``, unknown flags
    ignored), so this reads it with argparse set the same way: the exact flag or ``--attention-backend=X``,
    the last one wins, an abbreviation such as ``--attention-back`` is not this flag (Megatron ignores it),
    nor is anything after a ``--`` (argparse takes those as positionals, which Megatron does not have). A flag
    without its value, which Megatron would refuse, reads as "" here: the launch then fails in Slime."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--attention-backend", default="")
    try:
        return str(parser.parse_known_args(list(argv))[0].attention_backend)
    except argparse.ArgumentError:
        return ""


@dataclass(frozen=True)
class Estimate:
    """The bytes of one actor GPU at tensor parallelism ``tp`` and context parallelism ``cp``."""

    shape: ModelShape
    tp: int
    cp: int
    gpu_bytes: int
    teacher: bool = False  # the in-trainer teacher's copy and forward (module docstring)
    loss: LossShape = SLIME_LOSS
    unfused_attention: bool = False  # an extra --attention-backend unfused/local/auto: the scores may be materialised

    @property
    def budget(self) -> float:
        return self.gpu_bytes * USABLE

    @property
    def static(self) -> float:
        return self.shape.params * 6 / self.tp

    @property
    def layer_per_token(self) -> float:
        """The recomputed layer's bytes per token, activations and gradients."""
        return LAYER_GRAD_FACTOR * 2 * self.shape.layer_units

    @property
    def logit_bytes(self) -> int:
        return LOGIT_BYTES + PASS_BYTES * self.loss.passes

    @property
    def per_token(self) -> float:
        s = self.shape
        layer = 0 if s.custom_spec else self.layer_per_token
        return (2 * s.hidden * s.layers + layer + self.logit_bytes * s.vocab) / self.tp

    def whole_sample_layer(self, sample: int) -> float:
        """A custom spec's recomputed layer over the whole sample, split by neither TP nor CP (0 without one)."""
        return self.layer_per_token * sample if self.shape.custom_spec else 0.0

    def sample_rows(self, sample: int) -> int:
        return min(MAX_RESPONSE_TOKENS, math.ceil(sample / self.cp))

    def loss_sample(self, sample: int) -> float:
        """This project's losses: one sample's response rows at a time and one detached-entropy chunk of them
        (0 for Slime's own loss)."""
        rows = self.sample_rows(sample)
        per_vocab = self.loss.sample_bytes * rows + self.loss.chunk_bytes * min(rows, ENTROPY_CHUNK_ROWS)
        return per_vocab * self.shape.vocab / self.tp

    def scores(self, sample: int) -> float:
        """One layer's attention scores, only where attention runs unfused (never with the scripts' flash)."""
        if not self.unfused_attention:
            return 0.0
        return SCORE_BYTES * self.shape.heads / self.tp * math.ceil(sample / self.cp) ** 2

    def per_sample(self, sample: int) -> float:
        """What the longest sample adds beside the per-token bytes."""
        return self.whole_sample_layer(sample) + self.loss_sample(sample) + self.scores(sample)

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
        training = self.per_token * tokens_per_gpu + self.per_sample(sample)
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
        """``--max-tokens-per-gpu``: what fits beside the longest sample's own bytes, in steps of 1024, at least
        the longest sample's share (S / CP, which Slime would run alone anyway) and at most ``cap``."""
        room = (self.budget - self.static - RESERVE - self.teacher_weights - self.per_sample(sample)) / self.per_token
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


def _per_sample_line(e: Estimate, context: int) -> str:
    s, rows = e.shape, e.sample_rows(context)
    parts = []
    if e.loss.sample_bytes:
        bytes_rows = f"{e.loss.sample_bytes} B x {rows} response rows (min({MAX_RESPONSE_TOKENS}, CONTEXT_LENGTH / CP))"
        if e.loss.chunk_bytes:
            bytes_rows = (f"({bytes_rows} + {e.loss.chunk_bytes} B x {min(rows, ENTROPY_CHUNK_ROWS)} detached-entropy "
                          f"chunk rows (min(rows, ENTROPY_CHUNK_ROWS {ENTROPY_CHUNK_ROWS})))")
        parts.append(f"{e.loss.name}: {bytes_rows} x {s.vocab} vocab / TP {e.tp} = {_gb(e.loss_sample(context))}")
    if s.custom_spec:
        parts.append(f"--spec layer over the whole sample (not split by TP or CP): {LAYER_GRAD_FACTOR} x 2 B x "
                     f"{s.layer_units} x {context} = {_gb(e.whole_sample_layer(context))}")
    if e.unfused_attention:
        parts.append(f"unfused attention scores: {SCORE_BYTES} B x {s.heads} heads / TP {e.tp} x (CONTEXT_LENGTH "
                     f"{context} / CP {e.cp})^2 = {_gb(e.scores(context))}")
    else:
        parts.append("attention scores: none (--attention-backend flash)")
    return f"#   per sample = {'; '.join(parts)}"


def choose(shape: ModelShape | None, *, actor_gpus: int, context: int, gpu_gb: float, tp: int | None,
           cp: int | None, max_tokens: int | None, tp_default: int, node_gpus: Sequence[int] = (),
           teacher: bool = False, loss: LossShape = SLIME_LOSS, unfused_attention: bool = False) -> Choice:
    """TP (unless set), CP (unless set) and max tokens per GPU (unless set) for samples up to ``context``
    tokens: the default TP with CP 1 when that fits; else the pair (TP x CP dividing the actor GPUs, TP
    dividing the heads and query groups and, over several nodes, each node's Ray GPUs ``node_gpus``, so that no TP
    group spans nodes) that fits the longest sample, fewest CP ranks first. ``teacher``: the in-trainer
    teacher's copy and forward are counted (neither shrinks with TP or CP); ``loss``: what the variant's loss
    keeps; ``unfused_attention``: an extra ``--attention-backend unfused``/``local``/``auto`` (the scores counted)."""
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
    estimates = {p: Estimate(shape, p[0], p[1], gpu, teacher, loss, unfused_attention) for p in pairs}
    if default in estimates and estimates[default].fits(context):
        picked = default
    else:
        fitting = [p for p in pairs if estimates[p].fits(context)]
        picked = (min(fitting, key=lambda p: (p[1], -p[0])) if fitting
                  else max(pairs, key=lambda p: (estimates[p].longest(), -p[1])))
    e = estimates[picked]
    mt = max_tokens or e.tokens_per_gpu(context, context)
    tokens = max(mt, math.ceil(context / e.cp))
    total = e.total(context, tokens)
    s = shape
    layer = "" if s.custom_spec else f"{LAYER_GRAD_FACTOR} x 2 B x {s.layer_units} (recomputed layer) + "
    lines = (
        f"# memory per actor GPU (estimate, GPU_MEMORY_GB={gpu_gb:g}: budget 90% = {_gb(e.budget)}): model "
        f"{s.params / 1e9:.2f}B params ({s.layers} layers, hidden {s.hidden}, {s.heads} heads, vocab {s.vocab})",
        f"#   static   = params x 6 B (bf16 weights + fp32 grads; Adam on CPU) / TP {e.tp} = {_gb(e.static)}; "
        f"reserve {_gb(RESERVE)}",
        f"#   per token = (2 B x {s.hidden} x {s.layers} layers + {layer}({LOGIT_BYTES} + {PASS_BYTES} x "
        f"{e.loss.passes}) B x {s.vocab} vocab) / TP {e.tp} = {e.per_token / 1e6:.3f} MB; x max(MAX_TOKENS_PER_GPU "
        f"{mt}, CONTEXT_LENGTH / CP) = {_gb(e.per_token * tokens)}",
        _per_sample_line(e, context),
        *(() if not teacher else (
            f"#   teacher  = params x {TEACHER_WEIGHT_BYTES} B (in-trainer teacher: a whole bf16 copy on every actor "
            f"GPU, no grads/optimizer, not split by TP) = {_gb(e.teacher_weights)}; its forward of the longest sample "
            f"(not split by TP or CP) = 2 B x (3 x {s.hidden} + 4 x {s.heads} x {s.kv_channels} + 3 x {s.ffn}) x "
            f"{context} tokens + (min({MAX_RESPONSE_TOKENS}, {context}) + 1) rows x {s.vocab} vocab x "
            f"{TEACHER_LOGIT_BYTES} B = {_gb(e.teacher_forward(context))}, before the training pass: the total "
            f"takes the larger of it and per token + per sample",)),
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
