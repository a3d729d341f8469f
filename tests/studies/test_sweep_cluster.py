"""simfloat.sweep on clusters: the store's filesystem check and its shards (a store on NFS, Lustre, GPFS, ...),
the CPU each run records, and Slurm through dask-jobqueue: the job script of the options, and whole sweeps whose
jobs a stand-in ``sbatch`` starts on this machine from that job script (one of them killed with SIGKILL mid-run,
then the client). The runs use the toy kind of ``tests/sweep_toy.py``."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
import sigint

from simfloat.sweep import load, load_spec, run_sweep
from simfloat.sweep import store as store_mod
from simfloat.sweep.cluster import SlurmOptions, job_script
from simfloat.sweep.runner import host_cpu
from simfloat.sweep.store import (
    SharedFilesystemError,
    Store,
    check_local,
    filesystem_type,
    merge_shards,
    shard_dir,
    write_shard,
)

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
TOY = "sweep_toy:run"

distributed = pytest.importorskip("distributed")
posix = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL, sessions and the mount table are POSIX")

MOUNTINFO = r"""22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /home rw,relatime shared:2 - nfs4 fileserver:/export/home rw,vers=4.2
31 30 8:17 / /home/ann/local\040disk rw,relatime - xfs /dev/sdb1 rw
32 22 0:42 / /scratch rw,relatime - lustre 10.0.0.1@o2ib:/scratch rw
33 22 0:43 / /gpfs/proj rw,relatime - gpfs proj rw
34 22 0:44 / /mnt/remote rw,nosuid - fuse.sshfs ann@login: rw
35 22 0:45 / /var/lib/containers rw - fuse.fuse-overlayfs fuse-overlayfs rw
36 22 8:33 / /homes rw - ext4 /dev/sdc1 rw
37 22 0:46 / /cifs rw - cifs //server/share rw
38 22 0:47 / /beegfs rw - beegfs beegfs_nodev rw
39 22 0:48 / /ceph rw - ceph 10.0.0.2:/ rw
"""
PROC_MOUNTS = """/dev/sda1 / ext4 rw,relatime 0 0
fileserver:/export/home /home nfs rw,vers=3 0 0
/dev/sdc1 /homes ext4 rw 0 0
"""


def _spec(grid: dict, seeds: int | None = None, name: str = "toy") -> dict:
    sweep = {"name": name, "kind": TOY} | ({"seeds": seeds} if seeds is not None else {})
    return {"sweep": sweep, "grid": grid}


# -- the store's filesystem -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/home/ann/study/runs.db", ("nfs4", "/home")),
        ("/home", ("nfs4", "/home")),
        ("/home/ann/local disk/runs.db", ("xfs", "/home/ann/local disk")),  # a mount inside a mount; \040 a space
        ("/homes/ann/runs.db", ("ext4", "/homes")),  # /homes is not under /home
        ("/scratch/ann/runs.db", ("lustre", "/scratch")),
        ("/gpfs/proj/runs.db", ("gpfs", "/gpfs/proj")),
        ("/gpfs/other/runs.db", ("ext4", "/")),
        ("/mnt/remote/runs.db", ("fuse.sshfs", "/mnt/remote")),
        ("/tmp/runs.db", ("ext4", "/")),
    ],
)
def test_filesystem_type_is_the_longest_mount_point_prefix(path: str, want: tuple[str, str]) -> None:
    assert filesystem_type(path, MOUNTINFO) == want


def test_filesystem_type_reads_proc_mounts_and_this_machine() -> None:
    assert filesystem_type("/home/ann/runs.db", PROC_MOUNTS) == ("nfs", "/home")
    assert filesystem_type("/homes/ann/runs.db", PROC_MOUNTS) == ("ext4", "/homes")
    if Path("/proc/self/mountinfo").exists():
        found = filesystem_type(TESTS)
        assert found is not None and TESTS.as_posix().startswith(found[1])


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/home/ann/runs.db", "nfs4"),
        ("/scratch/runs.db", "lustre"),
        ("/gpfs/proj/runs.db", "gpfs"),
        ("/mnt/remote/runs.db", "fuse.sshfs"),
        ("/cifs/runs.db", "cifs"),
        ("/beegfs/runs.db", "beegfs"),
        ("/ceph/runs.db", "ceph"),
    ],
)
def test_a_store_on_a_network_filesystem_is_refused_naming_the_alternative(path: str, fstype: str) -> None:
    with pytest.raises(SharedFilesystemError, match=rf"on a {fstype} filesystem .*WAL.*--shards.*\.shards"):
        check_local(path, MOUNTINFO)


@pytest.mark.parametrize(
    "path", ["/home/ann/local disk/runs.db", "/homes/runs.db", "/tmp/runs.db", "/var/lib/containers/x/runs.db"]
)
def test_a_store_on_a_local_filesystem_is_accepted(path: str) -> None:
    check_local(path, MOUNTINFO)


@pytest.fixture
def on_nfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as if it were an NFS mount (the mount table the store reads is faked)."""
    table = MOUNTINFO + f"40 22 0:50 / {tmp_path.as_posix()} rw,relatime - nfs4 fileserver:/export/tmp rw\n"
    monkeypatch.setattr(store_mod, "_mount_table", lambda: table)
    return tmp_path


def test_sweep_refuses_a_store_on_nfs_and_runs_with_shards(on_nfs: Path, capsys: pytest.CaptureFixture) -> None:
    from simfloat.cli import main

    store = on_nfs / "runs.db"
    raw = _spec({"x": [1, 2, 3]})
    with pytest.raises(SharedFilesystemError, match="nfs4"):
        run_sweep(raw, store, workers=1, progress=False)
    assert not store.exists()
    spec = on_nfs / "s.toml"
    spec.write_text(f'[sweep]\nname = "toy"\nkind = "{TOY}"\n[grid]\nx = [1, 2, 3]\n')
    assert main(["sweep", str(spec), "--store", str(store), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nfs4 filesystem" in err and "--shards" in err and not store.exists()
    res = run_sweep(raw, store, workers=1, progress=False, shards=True)
    assert res.complete and res.ok == 3
    with closing(sqlite3.connect(store)) as db:  # merged at the end, in rollback-journal mode
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    assert sorted(load(store)["y"]) == [1.0, 2.0, 3.0]  # the reader opens it without WAL too


# -- shards ---------------------------------------------------------------------------------------------------


def _row(h: str, status: str, end: float, y: float | None) -> dict:
    return dict(
        config_hash=h,
        sweep="t",
        kind=TOY,
        config={"x": 1},
        metrics=None if y is None else {"y": y},
        status=status,
        error=None if y is not None else "boom",
        start=end - 1.0,
        end=end,
        wall_s=1.0,
    )


def test_merge_takes_the_newest_row_of_a_config_and_is_idempotent(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    shards = shard_dir(store)
    assert shards == tmp_path / "s.db.shards"
    Store(store).close()
    path = write_shard(shards, _row("a", "failed", 10.0, None))
    write_shard(shards, _row("b", "ok", 10.0, 2.0))
    assert path.parent == shards and list(shards.glob("*.db")) == [path]  # one shard per process
    assert merge_shards(store) == 2 and merge_shards(store) == 0
    write_shard(shards, _row("a", "ok", 20.0, 1.0))  # the failed run retried
    write_shard(shards, _row("b", "ok", 5.0, 9.0))  # an older row of b: not taken
    assert merge_shards(store) == 1
    with Store(store) as st:
        assert st.statuses() == {"a": "ok", "b": "ok"}
        assert {r["config_hash"]: r["metrics"]["y"] for r in st.rows()} == {"a": 1.0, "b": 2.0}
    (shards / "junk.db").write_text("not sqlite " * 100)
    with pytest.raises(ValueError, match="junk.db"):
        merge_shards(store)


def test_an_old_store_gains_the_cpu_columns(tmp_path: Path) -> None:
    store = tmp_path / "old.db"
    schema = store_mod._SCHEMA
    for col in store_mod._ADDED:
        schema = schema.replace(f",\n    {col} TEXT", "")
    assert "cpu" not in schema
    with closing(sqlite3.connect(store)) as db:
        db.execute(schema)
    with Store(store) as st:
        st.put(_row("a", "ok", 1.0, 3.0) | {"cpu": "generic"})
    df = load(store)
    assert df["cpu"].tolist() == ["generic"] and df["cpu_model"].isna().all() and df["y"].tolist() == [3.0]


def test_shards_give_the_rows_of_the_store_and_record_the_compile_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same sweep with shards (its workers compiling for a generic x86-64 CPU: the rows say so) and without
    (this CPU): the same rows."""
    raw = {**_spec({"x": [1, 2, 3], "a": 2.0}, seeds=2), "include": [{"x": 8, "fail": True}]}
    plain, sharded = tmp_path / "plain.db", tmp_path / "sharded.db"
    res = run_sweep(raw, plain, workers=2, progress=False)
    assert (res.ok, res.failed) == (6, 2)
    with monkeypatch.context() as m:
        m.setenv("NUMBA_CPU_NAME", "generic")  # the local cluster's workers inherit it
        res = run_sweep(raw, sharded, workers=2, progress=False, shards=True)
    assert (res.ok, res.failed) == (6, 2)
    assert 1 <= len(list(shard_dir(sharded).glob("*.db"))) <= 3  # one per worker process (a restart: one more)
    a, b = (load(p).sort_values("config_hash").reset_index(drop=True) for p in (plain, sharded))
    same = [*a.attrs["config_columns"], *[c for c in a.attrs["metric_columns"] if c != "pid"], "config_hash"]
    assert a[same + ["status"]].equals(b[same + ["status"]])
    assert (a["error"].isna() == b["error"].isna()).all()
    here = host_cpu()
    assert set(a["cpu"]) == {here["cpu"]} and set(a["cpu_features"]) == {here["cpu_features"]}
    assert set(a["cpu_model"]) == {here["cpu_model"]} and here["cpu"] != "generic"
    assert set(b["cpu"]) == {"generic"} and set(b["cpu_features"]) == {""}  # what numba compiled for
    # a rerun with shards skips them all; --retry-failed reruns the failed one, the newer row wins the merge
    res = run_sweep(raw, sharded, workers=1, progress=False, shards=True, retry_failed=True)
    assert (res.skipped, res.failed) == (6, 2)
    assert len(load(sharded)) == 8


def _rows(store: Path) -> int:
    try:
        return len(load(store))
    except (ValueError, sqlite3.OperationalError):  # not made yet, or a shard being created
        return 0


def _sweep_cli(spec: Path, store: Path, cwd: Path, *extra: str, path: str | None = None) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )
    if path is not None:
        env["PATH"] = path
    cmd = [sys.executable, "-m", "simfloat.cli", "sweep", str(spec), "--store", str(store), "--no-progress", *extra]
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=sigint.restore,
    )


def _wait_rows(proc: subprocess.Popen, store: Path, more_than: int) -> int:
    deadline = time.monotonic() + 120
    while (n := _rows(store)) <= more_than:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "no run committed within 120 s"
        time.sleep(0.1)
    return n


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@posix
def test_sigkill_of_the_client_with_shards_keeps_the_workers_runs(tmp_path: Path) -> None:
    """With shards the workers commit: every run they finished before the client's SIGKILL is kept (the store
    itself has none yet), and a rerun runs exactly the others."""
    n = 8
    spec = tmp_path / "slow.toml"
    spec.write_text(f'[sweep]\nname = "slow"\nkind = "{TOY}"\n[grid]\nx = {list(range(n))}\nsleep = 0.4\n')
    store = tmp_path / "slow.db"
    proc = _sweep_cli(spec, store, tmp_path, "--workers", "1", "--shards")
    try:
        _wait_rows(proc, store, 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _killpg(proc.pid)  # its local cluster, in its session
        proc.wait(10)
    kept = _rows(store)
    assert 2 <= kept < n
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 0  # all of them are in the shards
    first = load(store)[["config_hash", "start"]]
    res = run_sweep(spec, store, workers=1, progress=False, shards=True)
    assert (res.skipped, res.ok) == (kept, n - kept) and res.complete
    with Store(store, wal=False) as st:
        assert sorted(st.statuses()) == sorted(load_spec(spec).hashes())  # merged: one row per config
    merged = first.merge(load(store)[["config_hash", "start"]], on="config_hash", suffixes=("_before", "_after"))
    assert len(merged) == kept and (merged["start_before"] == merged["start_after"]).all()  # nothing rerun


# -- Slurm ----------------------------------------------------------------------------------------------------


def test_slurm_job_script_has_the_options() -> None:
    pytest.importorskip("dask_jobqueue")
    opts = SlurmOptions(
        cores=8,
        memory="16GB",
        processes=4,
        walltime="02:30:00",
        account="proj42",
        partition="cpu",
        directives=("gres=gpu:1", "exclusive", "constraint=avx512"),
        prologue=("module load python/3.12",),
        job_name="tiles",
    )
    script = job_script(opts)
    lines = script.splitlines()
    for want in (
        "#SBATCH -J tiles",
        "#SBATCH -p cpu",
        "#SBATCH -A proj42",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=15G",  # dask-jobqueue writes 16 GB as GiB, rounded up
        "#SBATCH -t 02:30:00",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=avx512",
        "export NUMBA_NUM_THREADS=2",  # 8 cores among 4 workers
        "module load python/3.12",
    ):
        assert want in lines, (want, script)
    worker = lines[-1]
    assert worker.startswith(f"{sys.executable} -m distributed.cli.dask_worker tcp://")
    assert "--nthreads 1 " in worker and "--nworkers 4 " in worker  # one run at a time in each worker
    assert lines.index("export NUMBA_NUM_THREADS=2") < lines.index("module load python/3.12") < len(lines) - 1
    bare = job_script(SlurmOptions(cores=1, memory="1GB")).splitlines()
    assert not any(line.startswith(("#SBATCH -A", "#SBATCH -p")) for line in bare)  # none unless asked for


@pytest.mark.parametrize(
    ("opts", "named"),
    [
        (SlurmOptions(cores=0), "cores"),
        (SlurmOptions(cores=2, processes=3), "processes"),
        (SlurmOptions(jobs=2, max_jobs=3), "one or the other"),
        (SlurmOptions(min_jobs=2), "needs max_jobs"),
        (SlurmOptions(min_jobs=4, max_jobs=3), "exceeds"),
        (SlurmOptions(min_jobs=-1, max_jobs=3), "min_jobs"),
        (SlurmOptions(walltime="2 hours"), "walltime"),
        (SlurmOptions(directives=("--gres=gpu:1",)), "KEY=VALUE"),
        (SlurmOptions(directives=("gres=gpu:1\n#SBATCH --x",)), "line break"),
        (SlurmOptions(prologue=("a\nb",)), "line break"),
    ],
)
def test_bad_slurm_options_fail_before_any_job(opts: SlurmOptions, named: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=named):
        run_sweep(_spec({"x": 1}), tmp_path / "s.db", cluster="slurm", slurm=opts, progress=False)
    assert not (tmp_path / "s.db").exists()


def test_slurm_needs_cores_memory_and_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("dask_jobqueue")
    from simfloat.cli import main

    with pytest.raises(ValueError, match="--cores"):
        job_script(SlurmOptions(memory="1GB"))
    with pytest.raises(ValueError, match="--memory"):
        job_script(SlurmOptions(cores=1))
    assert main(["sweep", "s.toml", "--store", "s.db", "--cores", "2"]) == 2
    assert "--cores: Slurm options need --cluster slurm" in capsys.readouterr().err
    spec = TESTS / "no-such.toml"
    assert main(["sweep", str(spec), "--store", "s.db", "--cluster", "slurm", "--cores", "2", "--memory", "1GB",
                 "--print-job-script"]) == 0  # fmt: skip
    assert "#SBATCH --cpus-per-task=2" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # as if not installed
    with pytest.raises(ImportError, match=r"simfloat-emu\[cluster\]"):
        job_script(SlurmOptions(cores=1, memory="1GB"))


SBATCH = """#!/bin/bash
# A stand-in for Slurm's sbatch: keeps the job script, runs it at once in the background in a session of its
# own (its id: the job id) from the submitting folder, as Slurm starts a job on a node.
d="$(dirname "$0")"
cp "$1" "$d/job-$$.sh"
setsid bash "$d/job-$$.sh" > "$d/job-$$.log" 2>&1 < /dev/null &
echo "$!" >> "$d/jobs"
echo "Submitted batch job $!"
"""
SCANCEL = """#!/bin/bash
for id in "$@"; do kill -TERM -- "-$id" 2>/dev/null; done
exit 0
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> object:
    """A folder with ``sbatch`` and ``scancel`` stand-ins, put first on PATH; every job it started is killed at
    the end."""
    if sys.platform == "win32" or shutil.which("setsid") is None:
        pytest.skip("the stand-in sbatch needs bash and setsid")
    pytest.importorskip("dask_jobqueue")
    d = tmp_path / "slurm-bin"
    d.mkdir()
    for name, text in (("sbatch", SBATCH), ("scancel", SCANCEL)):
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    yield d
    jobs = d / "jobs"
    for pid in jobs.read_text().split() if jobs.exists() else []:
        _killpg(int(pid))


def _jobs(d: Path) -> list[int]:
    jobs = d / "jobs"
    return [int(p) for p in jobs.read_text().split()] if jobs.exists() else []


def test_sweep_on_slurm_jobs_started_from_their_job_script(
    fake_slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{fake_slurm}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    raw = {**_spec({"x": [1, 2, 3, 4], "a": 3.0}), "include": [{"x": 9, "fail": True}]}
    opts = SlurmOptions(cores=2, memory="4GB", processes=2, walltime="00:10:00", partition="debug", jobs=1)
    res = run_sweep(raw, tmp_path / "s.db", cluster="slurm", slurm=opts, progress=False)
    assert (res.ok, res.failed, res.lost) == (4, 1, 0), res.summary()
    (script,) = fake_slurm.glob("job-*.sh")
    text = script.read_text()
    assert "#SBATCH -p debug" in text and "#SBATCH -t 00:10:00" in text and "--nworkers 2" in text
    df = load(tmp_path / "s.db")
    ok = df[df["status"] == "ok"]
    assert sorted(ok["y"]) == [3.0, 6.0, 9.0, 12.0]
    assert set(df["worker"]) <= {"SLURMCluster-0-0", "SLURMCluster-0-1"}  # job 0's two workers
    assert not set(df["pid"].dropna()) & {os.getpid()}  # run by the job's workers, not here
    assert len(_jobs(fake_slurm)) == 1


@posix
def test_sigkill_of_a_slurm_job_then_of_the_client_loses_only_runs_in_flight(fake_slurm: Path, tmp_path: Path) -> None:
    n = 10
    spec = tmp_path / "slow.toml"
    spec.write_text(f'[sweep]\nname = "slow"\nkind = "{TOY}"\n[grid]\nx = {list(range(n))}\nsleep = 0.5\n')
    store = tmp_path / "slow.db"
    path = f"{fake_slurm}{os.pathsep}{os.environ['PATH']}"
    slurm = ["--cluster", "slurm", "--cores", "1", "--memory", "2GB", "--jobs", "2", "--walltime", "10"]
    proc = _sweep_cli(spec, store, tmp_path, *slurm, path=path)
    try:
        before = _wait_rows(proc, store, 0)
        first, _ = _jobs(fake_slurm)
        _killpg(first)  # kill -9 of one job: its worker and nanny, mid-run
        after_job = _wait_rows(proc, store, before)  # the other job goes on, and takes the killed one's run
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _killpg(proc.pid)
        proc.wait(10)
        for pid in _jobs(fake_slurm):
            _killpg(pid)
    kept = _rows(store)
    assert after_job <= kept < n, "the client was to be killed mid-sweep"
    first_rows = load(store)[["config_hash", "start"]]
    res = run_sweep(spec, store, workers=1, progress=False)
    assert (res.skipped, res.ok) == (kept, n - kept) and res.complete
    df = load(store)
    assert sorted(df["config_hash"]) == sorted(load_spec(spec).hashes())
    merged = first_rows.merge(df[["config_hash", "start"]], on="config_hash", suffixes=("_before", "_after"))
    assert len(merged) == kept and (merged["start_before"] == merged["start_after"]).all()
