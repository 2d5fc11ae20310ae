"""The decode states ``bench.batched`` serves: the engine's own ``RequestDecode`` turned into a subclass
that records a request's steps (``record``) or forces a recorded request's steps (``replay``), and under
``Engine(loop="device")`` the recorded calls forced into the engine's slot buffers (``force_slots``)."""

from __future__ import annotations

import functools

import torch


class _Recording:
    """Keeps every block's opening state and every call's rows, parents, accepted drafts and result."""

    def start_block(self, seed):
        super().start_block(seed)
        self.record["starts"].append(self.state.to(torch.int32))

    def accept(self, conf_masked, tok_masked):
        rows, parents = self._rows
        super().accept(conf_masked, tok_masked)
        self.record["calls"].append({"rows": rows.to(torch.int32), "parents": list(parents),
                                     "accepted": int(self.steps[-1].accepted), "state": self.state.to(torch.int32)})


class _Forcing:
    """Runs the engine's own draft building and commit on the replay model's logits, then puts the
    recorded rows into the forward and the recorded state in place of the commit's (``forced``: the
    record's tensors already in the replay model's vocabulary)."""

    def start_block(self, seed):
        super().start_block(seed)
        self.state = self.forced["starts"][self.blocks - 1].clone()

    def rows(self, draft_budget=None):
        super().rows(draft_budget)
        call = self.forced["calls"][len(self.steps)]
        self._rows = (call["rows"], call["parents"])
        tally, stats = self.tally  # this engine forward's rows and logit positions so far
        tally.setdefault(stats.verify_calls, [0, 0])
        tally[stats.verify_calls][0] += int(call["rows"].shape[0])
        tally[stats.verify_calls][1] += int(call["masked"])
        return call["rows"]

    def forced_fold_masks(self):
        """A SpecFold record's masks of this call, already spread over the replay model's gates
        (``forced_tensors``), so the replay's work is the record's."""
        return self.forced["calls"][len(self.steps)].get("fold_masks")

    def accept(self, conf_masked, tok_masked):
        call = self.forced["calls"][len(self.steps)]
        super().accept(conf_masked, tok_masked)
        step = self.steps[-1]
        step.accepted = call["accepted"]
        self.state = call["state"].clone()

    def took_step(self, status, state):
        """``Engine(loop="device")``: the step's outcome read back from the device, replaced by the record's
        (``force_slots`` put the recorded rows into the call)."""
        call = self.forced["calls"][len(self.steps)]
        super().took_step(status, state)
        self.steps[-1].accepted = call["accepted"]
        self.state = call["state"].clone()


def force_slots(engine, tally: dict) -> None:
    """Under ``Engine(loop="device")`` (``serving.device_steps``): each step's bookkeeping runs on the
    device on the replay model's confidences as always (commit rule, acceptance walk, the next call's
    drafts), then the recorded next call of every ``_Forcing`` request stepped replaces the one the device
    built in its slot (one host-to-device copy a step); ``tally`` counts each forward's rows and logit
    positions."""
    steps = engine.device_steps
    # the class's own methods: engines sharing graphs share their SlotSteps, forced anew by each run
    forward_rows, settle = type(steps).forward_rows.__get__(steps), type(steps).settle.__get__(steps)

    def recorded_rows(decodes):
        rows = forward_rows(decodes)
        tally[engine.stats.verify_calls] = [sum(int(r.shape[0]) for r in rows), 0]
        return rows

    def recorded_settle(decodes, positions, conf, tok, also=None):
        tally[engine.stats.verify_calls][1] = sum(int(p.numel()) for p in positions)
        results = settle(decodes, positions, conf, tok, also)
        # the call after this one (a block's first call instead, ``load``, when the record's block ends)
        upcoming = [(d.slot, d.forced["calls"][len(d.steps) + 1]) for d in decodes
                    if len(d.steps) + 1 < len(d.forced["calls"])]
        if upcoming:
            steps.write_calls([s for s, _ in upcoming], [c["rows"].long() for _, c in upcoming],
                              [c["parents"] for _, c in upcoming])
        return results

    steps.forward_rows, steps.settle = recorded_rows, recorded_settle


@functools.cache
def _subclass(mixin: type, cls: type) -> type:
    return type(mixin.__name__ + cls.__name__, (mixin, cls), {})


def _as(decode, mixin):
    """``decode`` (the engine's decode state, whatever its class) turned into a ``mixin`` subclass of it."""
    decode.__class__ = _subclass(mixin, type(decode))
    return decode


def forced_tensors(rec: dict, table: torch.Tensor, mask: int, gates: int) -> dict:
    """A recorded request's tensors in the replay model's vocabulary (int64, CPU); ``masked``: a call's
    masked positions (``mask``: the record's mask id), whose logits it computes; a SpecFold record's fold
    masks spread over the replay model's ``gates`` (gate ``g`` takes the record's gate ``g * G_record //
    gates``, ``step_forcing.recorded_gates``, as ``bench.trace_driven`` maps them), here before the timed
    runs rather than at every call."""
    from specfold_compile.decoding.step_forcing import recorded_gates

    mapped = lambda t: table[t.long()]  # noqa: E731
    spread = lambda m: None if m is None else m[recorded_gates(m.shape[0], gates)]  # noqa: E731
    return {"starts": [mapped(s) for s in rec["starts"]],
            "calls": [{"rows": mapped(c["rows"]), "parents": c["parents"], "accepted": c["accepted"],
                       "state": mapped(c["state"]), "masked": int((c["rows"] == mask).sum()),
                       "fold_masks": spread(c.get("fold_masks"))} for c in rec["calls"]]}
