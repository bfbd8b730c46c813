"""Which of containerd's images the test-bed node removes at start (handoff_testbed.node.stale_images): earlier
builds of the project's image and the CRI plugin's id-named records of images no longer tagged, which kept 8.7 GB of
old builds' layers in one machine's cache."""
from __future__ import annotations

from handoff_testbed.node import stale_images

CURRENT = "ghcr.io/handoff-io/handoff:dev-7873b4ff30d5"
OLD = "ghcr.io/handoff-io/handoff:dev-0123456789ab"
PAUSE = "registry.k8s.io/pause:handoff-testbed"


def test_an_old_build_and_the_id_records_of_untagged_images_go_the_current_and_the_pause_image_stay() -> None:
    listing = [(CURRENT, "sha256:c0"), (PAUSE, "sha256:p0"), (OLD, "sha256:o0"),
               ("sha256:id-current", "sha256:c0"), ("sha256:id-pause", "sha256:p0"),
               ("sha256:id-old", "sha256:o0"), ("sha256:id-older", "sha256:o1")]
    assert stale_images(listing, {CURRENT, PAUSE}) == [OLD, "sha256:id-old", "sha256:id-older"]


def test_images_of_other_names_and_their_id_records_are_left_alone() -> None:
    listing = [("docker.io/library/busybox:1.36", "sha256:b0"), ("sha256:id-busybox", "sha256:b0")]
    assert stale_images(listing, {CURRENT, PAUSE}) == []


def test_with_every_tag_wanted_only_orphaned_id_records_go() -> None:
    """A node started for the pause image alone wants every tagged build kept."""
    listing = [(CURRENT, "sha256:c0"), (OLD, "sha256:o0"), ("sha256:id-old", "sha256:o0"),
               ("sha256:id-gone", "sha256:g0")]
    assert stale_images(listing, {CURRENT, OLD, PAUSE}) == ["sha256:id-gone"]
