"""The documentation's multi-node sections and the launch scripts they point at stay runnable.

The sections between the multinode markers (docs/multinode.md, slurm.md, resume.md and the multi-node table of
troubleshooting.md; any page may hold one) hold cluster-only ``console`` commands (torchrun per node, sbatch, resuming on another node
count, a restart loop). Each is turned into the ``fit`` command line the script would run and parsed with
``--print_config``, so a renamed option or config file fails here. The scripts' final command lines are
checked for the order that lets the launch shape win over config files; tests/e2e/test_resume.py runs
scripts/torchrun_node.sh for real (two nodes on loopback).
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest
import yaml
from doc_pages import REPO, doc_pages, multinode_spans

from yolo11_lightning.cli.lightning_cli import run_lightning_cli

TORCHRUN_NODE, SLURM = REPO / "scripts" / "torchrun_node.sh", REPO / "scripts" / "slurm_ddp.sbatch"


def section() -> str:
    """Every marked section of every page, in reading order."""
    parts = [text[start:end] for text in (page.read_text() for page in doc_pages())
             for start, end in multinode_spans(text)]  # fmt: skip
    assert parts, "no page has a <!-- multinode:start --> ... <!-- multinode:end --> section"
    return "\n".join(parts)


def console_commands() -> list[str]:
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", section(), flags=re.S | re.M)
    assert blocks and all(lang == "console" for lang, _ in blocks), "cluster-only commands go in ```console"
    return [line[2:] for _, body in blocks for line in body.splitlines() if line.startswith("$ ")]


def as_fit_args(command: str) -> list[str]:
    """The `yolo11-lightning fit` arguments a documented command ends up running."""
    tokens = shlex.split(command.split(";")[0])
    env = {}
    while re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):
        key, value = tokens.pop(0).split("=", 1)
        env[key] = value
    if tokens[0] == "until":
        tokens.pop(0)
    if tokens[0] == "scripts/torchrun_node.sh":  # see the script's last line (checked below)
        nodes, gpus = env.get("NNODES", "1"), env.get("GPUS_PER_NODE", "8")
        return [
            "fit",
            "--ckpt_path",
            "last",
            *tokens[1:],
            "--trainer.num_nodes",
            nodes,
            "--trainer.devices",
            gpus,
        ]
    if tokens[0] == "sbatch":
        nodes = tokens[tokens.index("--nodes") + 1]
        script = tokens.index("scripts/slurm_ddp.sbatch")
        return ["fit", "--ckpt_path", "last", *tokens[script + 1 :], "--trainer.num_nodes", nodes,
                "--trainer.devices", "8"]  # fmt: skip
    assert tokens[:2] == ["yolo11-lightning", "fit"], command
    return tokens[1:]


def test_scripts_pass_the_launch_shape_last_and_ckpt_path_first() -> None:
    for script in (TORCHRUN_NODE, SLURM):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, f"{script} has a syntax error"
    torchrun = TORCHRUN_NODE.read_text()
    assert (
        'fit --ckpt_path last "$@" --trainer.num_nodes "$NNODES" --trainer.devices "$GPUS_PER_NODE"'
        in torchrun
    )
    assert 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"' in torchrun
    slurm = SLURM.read_text().replace("\\\n", " ")
    assert re.search(
        r'srun --kill-on-bad-exit=1 python -m yolo11_lightning fit --ckpt_path last "\$@"\s+'
        r'--trainer.num_nodes "\$SLURM_JOB_NUM_NODES" --trainer.devices "\$SLURM_NTASKS_PER_NODE"',
        slurm,
    )
    assert "#SBATCH --ntasks-per-node=8" in slurm and "#SBATCH --gpus-per-node=8" in slurm


def test_multinode_commands_parse(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(REPO)
    commands = console_commands()
    assert any("torchrun_node.sh" in c for c in commands) and any("sbatch" in c for c in commands)
    assert any("--last_checkpoint.every_n_minutes" in c for c in commands)  # the save interval, documented
    for command in commands:
        args = as_fit_args(command)
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli([*args, "--print_config"])
        out = capsys.readouterr().out
        assert exit_info.value.code in (0, None), f"{command}\n{out[-2000:]}"
        config = yaml.safe_load(out)
        trainer = config["trainer"]
        if "--trainer.num_nodes" in args:  # the launch shape wins over the config files
            assert trainer["num_nodes"] == int(args[args.index("--trainer.num_nodes") + 1]), command
        if "multinode.yaml" in command:
            assert trainer["strategy"]["init_args"]["timeout"] is not None
            assert config["last_checkpoint"]["every_n_train_steps"] == 500, command
        if "--ckpt_path" in args:
            assert config["ckpt_path"] == args[len(args) - 1 - args[::-1].index("--ckpt_path") + 1]


def test_troubleshooting_rows_quote_what_the_two_host_tests_see(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The rows for a wrong MASTER_ADDR, a lost node and a hung rank quote the messages tests/e2e/test_netns.py
    and tests/e2e/test_faults.py check, and the HangWatchdog option given there parses."""
    text = section()
    assert "RendezvousConnectionError: The connection to the C10d store has failed" in text
    assert re.search(
        r"The client socket has failed to connect to any network address of \([\d.]+, \d+\)", text
    )
    for quoted in ("Not answering: rank 1 (node1, pid", "(rank 0's host) did not answer", "Fell behind: rank 5",
                   "torchrun is blocked: its exited workers stayed unreaped", "network interface docker0"):  # fmt: skip
        assert quoted in text, quoted
    (option,) = re.findall(
        r"`(--trainer\.callbacks\+=yolo11_lightning\.training\.callbacks\.hang_watchdog[^`]*)`", text
    )
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        run_lightning_cli(
            ["fit", "--config", "configs/quickstart.yaml", *shlex.split(option), "--print_config"]
        )
    callbacks = yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"]
    assert {"class_path": "yolo11_lightning.training.callbacks.hang_watchdog.HangWatchdog",
            "init_args": {"deadline": 120.0, "interval": None, "exit_after": None}} in callbacks  # fmt: skip


NCCL_DUMP = {
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


@pytest.mark.parametrize(
    "script", ["scripts/torchrun_node.sh", "scripts/slurm_ddp.sbatch", "benchmarks/device/gpu_run.sh"]
)
def test_launch_scripts_export_the_flight_recorder_dump(script: str, tmp_path) -> None:
    """NCCL's watchdog aborts a rank whose collective timed out before Python sees it: the flight recorder's dump
    is the report left. The scripts' exports, run in bash from a clean environment, give every rank the dump
    (both torch's current and older names, in a folder they create) and expandable segments; a user's values
    win."""
    sourced = (REPO / "scripts" / "nccl_env.sh").read_text().splitlines()
    lines = []  # the script's, with scripts/nccl_env.sh in place of the line sourcing it
    for line in (REPO / script).read_text().splitlines():
        lines += sourced if line.startswith("source ") and "nccl_env.sh" in line else [line]
    names = ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_", "TORCH_NCCL_TRACE_BUFFER_SIZE",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "PYTORCH_CUDA_ALLOC_CONF")  # fmt: skip
    exports = [line for line in lines if line.startswith("export ") and any(n in line for n in names)]
    made = [line for line in lines if line.startswith('mkdir -p "$(dirname "$TORCH_FR_DUMP_TEMP_FILE")"')]
    assert len(exports) == 6 and made, "\n".join(exports)
    folder = [line for line in lines if line.startswith("FLIGHT_RECORDER_DIR=")]
    shell = "\n".join(["set -eu", f'OUT="{tmp_path}/out"', *folder, *exports, *made, "env"])

    def run(**env: str) -> dict[str, str]:
        out = subprocess.run(["bash", "-c", shell], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env},
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    got = run()
    assert {k: got.get(k) for k in NCCL_DUMP} == NCCL_DUMP
    prefix = got["TORCH_FR_DUMP_TEMP_FILE"]
    assert got["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix and prefix.endswith(
        "/flight_recorder/nccl_trace_rank_"
    )
    assert (
        prefix.startswith(str(tmp_path)) and (tmp_path / prefix).parent.is_dir()
    )  # in the run's folder, made
    assert run(TORCH_FR_BUFFER_SIZE="50")["TORCH_FR_BUFFER_SIZE"] == "50"
