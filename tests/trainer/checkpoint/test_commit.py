import pytest

from trainer.checkpoint.commit import (
    attempts_in,
    commit_marker,
    file_name,
    files_dir,
    group_by_step,
    marker_problem,
    superseded,
)

FILES = [
    {"name": "__0_0.distcp", "size": 100, "sha256": "a"},
    {"name": ".metadata", "size": 7, "sha256": "b"},
]


def marker(step=20, files=FILES):
    return commit_marker(step=step, files=files, world_size=2, time=1.0)


def test_marker_lists_files_sorted_and_refuses_duplicates():
    assert [f["name"] for f in marker()["files"]] == [".metadata", "__0_0.distcp"]
    with pytest.raises(ValueError, match="lists a file twice"):
        marker(files=FILES + FILES[:1])


@pytest.mark.parametrize(
    "the_marker, sizes, problem",
    [
        (marker(), {"__0_0.distcp": 100, ".metadata": 7}, None),
        (None, {}, "no _COMMITTED marker (its save did not finish)"),
        (
            marker(),
            {"__0_0.distcp": None, ".metadata": 7},
            "file __0_0.distcp listed in _COMMITTED is missing",
        ),
        (
            marker(),
            {"__0_0.distcp": 60, ".metadata": 7},
            "file __0_0.distcp has 60 bytes, _COMMITTED says 100",
        ),
        (
            marker(step=30),
            {"__0_0.distcp": 100, ".metadata": 7},
            "_COMMITTED says step 30, the folder says step 20",
        ),
        ({"files": []}, {}, "_COMMITTED is not a trainops.checkpoint/v1 document"),
        (
            {**marker(), "dir": "../../elsewhere"},
            {"__0_0.distcp": 100, ".metadata": 7},
            "_COMMITTED names the files folder '../../elsewhere'; expected attempt_<number>",
        ),
        (marker(), None, None),  # sizes=None: the shape only
    ],
)
def test_marker_problem(the_marker, sizes, problem):
    assert marker_problem(the_marker, sizes, 20) == problem


def test_a_marker_names_its_attempt_and_the_folder_of_its_files():
    owned = commit_marker(step=20, files=FILES, world_size=2, time=1.0, attempt=3)
    assert (owned["attempt"], owned["dir"], files_dir(owned)) == (3, "attempt_3", "attempt_3")
    assert files_dir(marker()) == ""  # written before attempts had folders: files in step_<N>/


def test_group_by_step_keeps_step_files_and_attempt_folders_and_ignores_other_objects():
    root = "file:///r/checkpoints"
    uris = [
        f"{root}/latest.json",
        f"{root}/step_00000010/_COMMITTED",
        f"{root}/step_00000010/.metadata",
        f"{root}/step_00000020/__0_0.distcp",
        f"{root}/step_00000020/attempt_2/__0_0.distcp",
        f"{root}/junk/x",
        f"{root}/step_00000030/nested/x",
        f"{root}/step_00000030/attempt_1/deeper/x",
        f"{root}/step_00000030/attempt_0/x",
    ]
    assert group_by_step(uris, root) == {
        10: {
            "_COMMITTED": f"{root}/step_00000010/_COMMITTED",
            ".metadata": f"{root}/step_00000010/.metadata",
        },
        20: {
            "__0_0.distcp": f"{root}/step_00000020/__0_0.distcp",
            "attempt_2/__0_0.distcp": f"{root}/step_00000020/attempt_2/__0_0.distcp",
        },
    }
    assert file_name("attempt_2/.metadata") == (2, ".metadata") and file_name("x") == (None, "x")
    assert file_name("nested/x") is None


def test_a_new_commit_of_a_step_supersedes_older_attempts_and_legacy_files_only():
    folder = "file:///r/checkpoints/step_00000020"
    files = {
        name: f"{folder}/{name}"
        for name in ("_COMMITTED", "__0_0.distcp", "attempt_1/a", "attempt_2/a", "attempt_3/a")
    }
    assert attempts_in(files) == {1, 2, 3}
    assert superseded(files, 2) == ([1], [f"{folder}/__0_0.distcp"])
    assert superseded({"_COMMITTED": f"{folder}/_COMMITTED"}, 1) == ([], [])
