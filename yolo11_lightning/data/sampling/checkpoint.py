"""``TrainSamplerCheckpoint``: the train sampler's position in checkpoints, for mid-epoch resumes.

A mixin of ``YOLODataModule`` (``state_dict`` / ``load_state_dict``); it reads the DataModule's
``trainer``, ``batch_size``, ``_train_sampler`` and ``_pending_sampler_state``.
"""

from __future__ import annotations

from typing import Any


class TrainSamplerCheckpoint:
    """Mixin of ``YOLODataModule``: saves and restores the ``ElasticDistributedSampler`` position."""

    def _fit_progress_samples(self) -> int | None:
        """Global samples of the current epoch that training has finished, from the Trainer's loop."""
        trainer = self.trainer
        if trainer is None or getattr(getattr(trainer, "state", None), "fn", None) != "fit":
            return None
        try:
            ready = int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)
            epoch_batches = trainer.num_training_batches
        except AttributeError:
            return None
        if ready >= epoch_batches:  # the epoch is over (also when limit_train_batches cut it short)
            return self._train_sampler.total_size if self._train_sampler is not None else None
        # A checkpoint is written once a batch is done (on_train_batch_end or after validation), when
        # `ready` already counts it; every batch is one global batch of samples.
        return ready * self.batch_size

    def state_dict(self) -> dict[str, Any]:
        """The train sampler's position: ``{"train_sampler": {"epoch", "consumed_samples", "seed"}}``."""
        sampler = self._train_sampler
        if sampler is None:
            return (
                {}
                if self._pending_sampler_state is None
                else {"train_sampler": dict(self._pending_sampler_state)}
            )
        state = sampler.state_dict()
        consumed = self._fit_progress_samples()
        if consumed is not None:
            state["consumed_samples"] = min(consumed, sampler.total_size)
        return {"train_sampler": state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the sampler position now, or when the train sampler gets created."""
        state = state_dict.get("train_sampler")
        if state is None:
            return
        if self._train_sampler is not None:
            self._train_sampler.load_state_dict(state)
        else:
            self._pending_sampler_state = dict(state)
