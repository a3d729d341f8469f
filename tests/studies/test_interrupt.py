"""Ctrl-C during ``simfloat attribute`` and ``simfloat-gpu validate``: the command stops within seconds (even in the
middle of a long kernel call), says what was finished, keeps it on disk and exits with status 130, without a
traceback. Each test runs a small CLI job in a subprocess and sends it SIGINT once some of the work is done."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sigint

ROOT = Path(__file__).resolve().parents[2]
#: seconds allowed from SIGINT to the exit (the commands poll every 0.1 s; this machine may be loaded)
STOP_S = 5.0
#: seconds allowed for the job to get going (a cold numba cache compiles the engine for minutes)
START_S = 900.0

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a subprocess is POSIX")


class _Job:
    """A ``python -m MODULE`` subprocess (the ``simfloat`` command by default) whose stdout and stderr are
    collected as they come."""

    def __init__(self, args: list[str], cwd: Path, module: str = "simfloat.cli") -> None:
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            TRITON_INTERPRET="1",
            PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "gpu"), os.environ.get("PYTHONPATH", "")]),
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=sigint.restore,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(s, b), daemon=True)
            for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, sink: list[str]) -> None:
        while True:
            chunk = stream.read(1)
            if not chunk:
                return
            sink.append(chunk)

    def text(self) -> tuple[str, str]:
        return "".join(self.out), "".join(self.err)

    def wait_for(self, ready) -> None:
        t0 = time.monotonic()
        while not ready(*self.text()):
            if self.proc.poll() is not None:
                out, err = self.text()
                pytest.fail(
                    f"the job ended (status {self.proc.returncode}) before it could be interrupted:\n"
                    f"{out[-2000:]}\n{err[-2000:]}"
                )
            if time.monotonic() - t0 > START_S:
                self.proc.kill()
                pytest.fail("the job did not get going in time")
            time.sleep(0.05)

    def interrupt(self) -> float:
        """SIGINT; returns the seconds until the process exited."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        dt = time.monotonic() - t0
        for t in self._readers:
            t.join(timeout=10)
        return dt


def _runs_done(err: str) -> tuple[int, int]:
    """The progress bar's last ``done/total``."""
    found = re.findall(r"(\d+)/(\d+) \[", err)
    return (int(found[-1][0]), int(found[-1][1])) if found else (0, 0)


def test_ctrl_c_stops_attribute_and_keeps_the_finished_runs(tmp_path):
    # all-bf16 (every op rounded to bf16) at seq 2048: about a second per kernel run, some 35 runs
    out_dir = tmp_path / "out"
    job = _Job(
        [
            "attribute",
            "--seq",
            "2048",
            "--head-dim",
            "64",
            "--plan",
            "all-bf16",
            "--trace-rows",
            "4",
            "--out",
            str(out_dir),
        ],
        tmp_path,
    )
    job.wait_for(lambda out, err: _runs_done(err)[0] >= 3)
    dt = job.interrupt()
    out, err = job.text()
    assert job.proc.returncode == 130, (job.proc.returncode, err[-3000:])
    assert dt < STOP_S, f"{dt:.1f} s from SIGINT to exit"
    assert "Traceback" not in err, err[-3000:]
    m = re.search(r"interrupted after [\d.]+ s: (\d+) of (\d+) kernel runs finished, kept in (\S+)", err)
    assert m, err[-2000:]
    done, total = int(m.group(1)), int(m.group(2))
    assert 3 <= done < total, (done, total)
    assert Path(m.group(3)) == out_dir / "partial_runs.csv"
    with open(out_dir / "partial_runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == done
    assert rows[0]["kernel"] == "baseline" and rows[0]["plan"] == "fp64" and float(rows[0]["max_abs"]) == 0.0
    assert all(r["max_abs"] != "" for r in rows)  # the golden run came first: every run has its deviation
    assert any(r["plan"] == "all-bf16" and float(r["max_abs"]) > 0 for r in rows)
    assert "interrupted" in (out_dir / "summary.txt").read_text()


@pytest.mark.triton
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_validate_and_keeps_the_finished_configs(jobs, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out_dir = tmp_path / "rep"
    job = _Job(
        ["validate", "--grid", "ci", "--backend", "faithful", "--jobs", jobs, "--out", str(out_dir)],
        tmp_path,
        module="simfloat_gpu.campaign.cli",
    )
    job.wait_for(lambda out, err: re.search(r"^\[1/\d+\]", out, re.M) is not None)
    dt = job.interrupt()
    out, err = job.text()
    assert job.proc.returncode == 130, (job.proc.returncode, err[-3000:])
    assert dt < STOP_S, f"{dt:.1f} s from SIGINT to exit"
    assert "Traceback" not in err, err[-3000:]
    m = re.search(r"validate: interrupted after [\d.]+ s: (\d+) of (\d+) configs finished", err)
    assert m, err[-2000:]
    done, total = int(m.group(1)), int(m.group(2))
    assert 1 <= done < total
    with open(out_dir / "validation.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == total
    assert sum(r["status"] == "ok" for r in rows) == done
    assert sum(r["status"] == "skipped: interrupted" for r in rows) == total - done
    assert all(float(r["bitwise_agreement"]) == 1.0 for r in rows if r["status"] == "ok")
