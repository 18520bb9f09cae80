"""The trainer feed: weight versions (``versions``) and exactly-once claims of complete groups (``claims``)."""

from polar.feed.claims import ClaimedBatch, FeedTrajectory, Group, ack, claim, expire_leases, release, renew
from polar.feed.versions import VersionRecord, current, list_versions, ordinals, register

__all__ = [
    "ClaimedBatch",
    "FeedTrajectory",
    "Group",
    "VersionRecord",
    "ack",
    "claim",
    "current",
    "expire_leases",
    "list_versions",
    "ordinals",
    "register",
    "release",
    "renew",
]
