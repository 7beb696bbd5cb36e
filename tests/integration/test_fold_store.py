"""The fold's compare-and-set on an object store (SeaweedFS's S3 API): the list of segments is
written only if absent (S3's conditional put) and listed again, as on a local disk."""

from __future__ import annotations

import pytest

from pidfence.spark_sink.storage import Store
from tests.fixtures.store import Bucket
from tests.unit.test_fold_merge import B_FOLDS, assert_a_stalled_fold_deletes_nothing

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("b_folds", B_FOLDS)
def test_a_stalled_fold_on_s3_deletes_nothing(
    s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch, b_folds: str
) -> None:
    own = Store.at(f"{s3_bucket.uri}/out/_pidfence")
    assert own.s3
    assert_a_stalled_fold_deletes_nothing(own, monkeypatch, B_FOLDS[b_folds])
