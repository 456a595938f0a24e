"""Every hostile artifact is rejected with its own code, and nothing is left behind."""

from __future__ import annotations

import pytest

from registry.ingest import ArtifactRejected, stage_and_inspect
from tests.registry.ingest.hostile_corpus import HOSTILE_ARTIFACTS, as_sources


def test_the_corpus_is_large_and_uniquely_named():
    names = [artifact.name for artifact in HOSTILE_ARTIFACTS]
    assert len(names) >= 20
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("artifact", HOSTILE_ARTIFACTS, ids=lambda a: a.name)
def test_it_rejects_hostile_artifact(artifact, tmp_path):
    dest = tmp_path / "staged"
    dest.mkdir()

    with pytest.raises(ArtifactRejected) as caught:
        stage_and_inspect(as_sources(artifact.build()), dest, artifact.limits)

    assert (caught.value.code, caught.value.status) == (
        artifact.expected_code,
        artifact.expected_status,
    ), caught.value.message
    assert caught.value.message
    assert list(dest.iterdir()) == []
