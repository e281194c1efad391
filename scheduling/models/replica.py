"""Beat replicas as they last reported themselves."""

from __future__ import annotations

from django.db import models


class Replica(models.Model):
    """One beat replica as it last reported itself: for display and health probes only.

    ``scheduling.replicas.Heartbeat`` upserts the row at most every
    ``cadences.HEARTBEAT_INTERVAL`` seconds, outside any claim transaction; times are the
    database clock (aware, UTC). Nothing in the claim path reads it: a replica without a row, or
    with a stale one, dispatches as usual.
    ``runs_claimed`` counts the runs this process committed a claim on since ``started_at``.
    ``stopped_at`` is set on a clean shutdown; a killed replica keeps its last tick and shows stale.
    """

    id = models.CharField("replica", max_length=255, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_tick_at = models.DateTimeField()
    runs_claimed = models.PositiveBigIntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_tick_at"]

    def __str__(self) -> str:
        return self.id
