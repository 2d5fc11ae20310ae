"""The decode states ``bench.batched`` serves: the engine's own ``RequestDecode`` turned into a subclass
that records a request's steps (``record``) or forces a recorded request's steps (``replay``)."""

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
        """A SpecFold record's masks of this call: gate ``g`` of the replay model takes the record's gate
        ``g * G_record // G`` (``step_forcing.recorded_gates``, as ``bench.trace_driven`` maps them), so
        the replay's work is the record's."""
        masks = self.forced["calls"][len(self.steps)].get("fold_masks")
        if masks is None:
            return None
        from specfold_compile.decoding.step_forcing import recorded_gates

        return masks[recorded_gates(masks.shape[0], self.gates)]

    def accept(self, conf_masked, tok_masked):
        call = self.forced["calls"][len(self.steps)]
        super().accept(conf_masked, tok_masked)
        step = self.steps[-1]
        step.accepted = call["accepted"]
        self.state = call["state"].clone()


@functools.cache
def _subclass(mixin: type, cls: type) -> type:
    return type(mixin.__name__ + cls.__name__, (mixin, cls), {})


def _as(decode, mixin):
    """``decode`` (the engine's decode state, whatever its class) turned into a ``mixin`` subclass of it."""
    decode.__class__ = _subclass(mixin, type(decode))
    return decode


# --- record --------------------------------------------------------------------------------------
