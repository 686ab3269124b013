import datetime as dt
import json
import threading

from harness import rundir


def test_same_second_claims_get_suffixes(tmp_path):
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    dirs = [rundir.claim_run_dir(tmp_path, "mm", now) for _ in range(3)]
    assert [d.name for d in dirs] == ["mm_20261129-100000", "mm_20261129-100000-1", "mm_20261129-100000-2"]


def test_concurrent_claims_never_share(tmp_path):
    now = dt.datetime(2026, 11, 29, 10, 0, 0)
    got = []
    threads = [threading.Thread(target=lambda: got.append(rundir.claim_run_dir(tmp_path, "op", now)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 8


def test_merge_is_deep_and_keeps_other_keys(tmp_path):
    p = tmp_path / "run.json"
    rundir.merge_json(p, {"spec": {"op": "mm"}, "observed": {"device": {"name": "x"}}})
    rundir.merge_json(p, {"observed": {"device": {"arch": "sm_90"}, "rows": 3}})
    assert json.loads(p.read_text()) == {"spec": {"op": "mm"},
                                         "observed": {"device": {"name": "x", "arch": "sm_90"}, "rows": 3}}


def test_atomic_write_leaves_no_temp_files(tmp_path):
    rundir.atomic_write_json(tmp_path / "a.json", {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
