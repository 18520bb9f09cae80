"""Harbor task folders read into TaskRequests: the mapping of task.toml, and a clear error per bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polar.errors import EvaluationError, InvalidRequest
from polar.evaluators.harbor import reward_from
from polar.rollout.spec import parse_task_request
from polar.tasks import load_tasks
from polar.tasks.harbor import load_harbor, memory_mb, read_task

DATASET = Path(__file__).resolve().parents[2] / "datasets" / "harbor-mini"
AGENT = {"name": "agent"}


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    """A copy of one dataset task, free to break."""
    return Path(shutil.copytree(DATASET / "fix-kv-parser", tmp_path / "fix-kv-parser"))


def test_the_dataset_imports_as_valid_task_requests():
    tasks = load_harbor([DATASET])
    assert len(tasks) >= 8 and all(task.solution for task in tasks)
    for task in tasks:
        request = parse_task_request(task.request(AGENT, samples=2))
        assert request.name == task.task_id and request.num_samples == 2
        assert request.evaluator.type == "harbor" and "test.sh" in request.evaluator.config["files"]
        assert "def test_" not in request.instruction  # the agent is told the instruction only
        for oracle_or_noop in (task.oracle_request(), task.noop_request()):
            parse_task_request(oracle_or_noop)


def test_task_toml_maps_onto_the_runtime_and_evaluator(task_dir: Path):
    toml = (task_dir / "task.toml").read_text()
    toml = toml.replace("memory_mb = 1024", 'memory = "1.5G"').replace("cpus = 1", "cpus = 0.5")
    toml = toml.replace("[verifier]\n", '[verifier]\nuser = "nobody"\nenv = { MODE = "strict" }\n')
    (task_dir / "task.toml").write_text(toml)
    request = read_task(task_dir).request(AGENT)
    options = request["runtime"]["options"]
    assert options["cpus"] == 0.5 and options["memory_mb"] == 1536 and options["network"] == "none"
    assert options["build"]["context"] == str(task_dir.resolve() / "environment") and options["seed_workdir"]
    assert options["build"]["timeout_s"] == 300.0 and options["build"]["network"] == "none"  # allow_internet false
    assert request["evaluator"]["network"] == "none"  # the verifier stays offline whatever POLAR_VERIFY_NETWORK says
    assert request["agent_timeout_s"] == 300.0 and request["evaluator"]["timeout_s"] == 60.0
    assert request["evaluator"]["config"]["user"] == "nobody"
    assert request["evaluator"]["config"]["env"] == {"MODE": "strict"}
    assert request["evaluator"]["config"]["executables"] == ["test.sh"]
    assert request["metadata"]["harbor"]["metadata"]["category"] == "python"
    (task_dir / "task.toml").write_text(toml.replace("allow_internet = false", "allow_internet = true"))
    online = read_task(task_dir).request(AGENT)
    assert "network" not in online["runtime"]["options"] and "network" not in online["runtime"]["options"]["build"]
    assert "network" not in online["evaluator"]  # the settings' defaults (all offline unless set)


def test_polar_run_reads_a_folder_with_samples_and_harness():
    tasks = load_tasks(DATASET / "hello-file", harness={"name": "command", "config": {"command": "true"}}, samples=4)
    assert [t["num_samples"] for t in tasks] == [4] and tasks[0]["harness"]["name"] == "command"


def _error(path: Path) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        load_harbor([path])
    return caught.value


def test_missing_instruction_is_named(task_dir: Path):
    (task_dir / "instruction.md").unlink()
    error = _error(task_dir)
    assert error.field == "instruction.md" and "fix-kv-parser" in error.message


def test_empty_instruction_is_named(task_dir: Path):
    (task_dir / "instruction.md").write_text("  \n")
    assert _error(task_dir).field == "instruction.md"


@pytest.mark.parametrize(
    ("section", "line", "field"),
    [
        ("[agent]", "max_turns = 3", "task.toml [agent] max_turns"),
        ("[verifier]", "timeout = 3", "task.toml [verifier] timeout"),
        ("[environment]", "gpu_type = 'h100'", "task.toml [environment] gpu_type"),
    ],
)
def test_unknown_keys_in_sections_we_act_on_are_named(task_dir: Path, section: str, line: str, field: str):
    toml = (task_dir / "task.toml").read_text().replace(f"{section}\n", f"{section}\n{line}\n")
    (task_dir / "task.toml").write_text(toml)
    error = _error(task_dir)
    assert error.field == field and "unknown key" in error.message and "fix-kv-parser" in error.message


def test_unknown_metadata_and_sections_are_kept(task_dir: Path):
    toml = (task_dir / "task.toml").read_text().replace("[metadata]\n", "[metadata]\nsource = 'x'\n")
    (task_dir / "task.toml").write_text(toml + "\n[review]\nstatus = 'draft'\n")
    task = read_task(task_dir)
    assert task.config.metadata["source"] == "x" and task.extra == {"review": {"status": "draft"}}


def test_the_solution_env_reaches_the_oracle_and_gpu_types_are_accepted(task_dir: Path):
    """``[solution] env`` is the environment ``solve.sh`` runs with (quoted for the shell); ``gpu_types`` says
    which GPUs would do, moot with no GPU asked for, so it is no reason to refuse the task."""
    toml = (task_dir / "task.toml").read_text().replace("cpus = 1", "cpus = 1\ngpu_types = ['H100']")
    (task_dir / "task.toml").write_text(toml + "\n[solution]\nenv = { MODE = 'fast mode', N = '2' }\n")
    command = read_task(task_dir).oracle_request()["harness"]["config"]["command"]
    assert command.endswith("&& env 'MODE=fast mode' N=2 bash /solution/solve.sh")
    (task_dir / "task.toml").write_text(toml + "\n[solution]\nenvs = {}\n")
    assert _error(task_dir).field == "task.toml [solution] envs"


def test_mcp_servers_are_read_and_refused_saying_why(task_dir: Path):
    """Harbor's ``[[environment.mcp_servers]]`` is a known key: an empty list imports; servers are refused, since
    the agent would run without the tools the task gives it; a malformed entry names its field."""
    toml = (task_dir / "task.toml").read_text().replace("cpus = 1", "cpus = 1\nmcp_servers = []")
    (task_dir / "task.toml").write_text(toml)
    assert read_task(task_dir).request(AGENT)
    server = (
        '\n[[environment.mcp_servers]]\nname = "search"\ntransport = "streamable-http"\nurl = "http://mcp:8000/mcp"\n'
    )
    (task_dir / "task.toml").write_text(toml.replace("\nmcp_servers = []", "") + server)
    error = _error(task_dir)
    assert error.field == "task.toml [environment] mcp_servers" and "does not start MCP servers" in error.message
    assert "(search)" in error.message
    (task_dir / "task.toml").write_text(toml.replace("\nmcp_servers = []", "") + server.replace("url", "uri"))
    assert _error(task_dir).field == "task.toml [environment.mcp_servers.0] uri"


def test_a_bad_memory_size_and_a_gpu_are_refused(task_dir: Path):
    toml = (task_dir / "task.toml").read_text()
    (task_dir / "task.toml").write_text(toml.replace("memory_mb = 1024", 'memory = "lots"'))
    assert _error(task_dir).field == "task.toml [environment] memory"
    (task_dir / "task.toml").write_text(toml.replace("cpus = 1", "cpus = 1\ngpus = 1"))
    assert _error(task_dir).field == "task.toml [environment] gpus"


def test_toml_that_does_not_parse_is_named(task_dir: Path):
    (task_dir / "task.toml").write_text("[agent\n")
    assert _error(task_dir).field == "task.toml"


def test_missing_tests_dockerfile_and_solve_sh_are_named(task_dir: Path):
    (task_dir / "solution" / "solve.sh").rename(task_dir / "solution" / "fix.sh")
    assert _error(task_dir).field == "solution/solve.sh"
    shutil.rmtree(task_dir / "solution")
    assert read_task(task_dir).solution is None  # an oracle is optional...
    with pytest.raises(InvalidRequest, match="no solution/solve.sh"):
        read_task(task_dir).oracle_request()  # ...but a check needs it
    (task_dir / "environment" / "Dockerfile").unlink()
    assert _error(task_dir).field == "environment/Dockerfile"
    (task_dir / "task.toml").write_text(
        (task_dir / "task.toml").read_text().replace("[environment]\n", "[environment]\ndocker_image = 'x:1'\n")
    )
    assert read_task(task_dir).request(AGENT)["runtime"]["options"]["image"] == "x:1"
    (task_dir / "tests" / "test.sh").unlink()
    assert _error(task_dir).field == "tests/test.sh"


def test_nothing_is_half_imported(tmp_path: Path):
    for name in ("hello-file", "log-errors"):
        shutil.copytree(DATASET / name, tmp_path / "set" / name)
    (tmp_path / "set" / "log-errors" / "instruction.md").unlink()
    with pytest.raises(InvalidRequest, match="log-errors: instruction.md"):
        load_harbor([tmp_path / "set"])
    with pytest.raises(InvalidRequest, match="no Harbor task folders"):
        load_harbor([tmp_path])


def test_binary_test_files_travel_as_base64(task_dir: Path):
    (task_dir / "tests" / "data.bin").write_bytes(b"\xff\x00\xfe")
    task = read_task(task_dir)
    assert task.binary_tests == {"data.bin": "/wD+"} and "data.bin" not in task.tests


def test_memory_sizes():
    assert [memory_mb(s) for s in ("2G", "512M", "1.5GiB", "1024k", "1T")] == [2048, 512, 1536, 1, 1048576]


def test_the_reward_rule():
    assert reward_from("1\n", '{"reward": 0}', "reward") == (1.0, {"source": "reward.txt", "raw": 1.0})
    assert reward_from("1.7", None, "reward")[0] == 1.0  # clamped, raw kept
    reward, details = reward_from(None, '{"reward": 0.5, "style": 1}', "reward")
    assert reward == 0.5 and details["components"] == {"reward": 0.5, "style": 1.0} and details["rule"] == "reward"
    reward, details = reward_from(None, '{"tests": 1, "style": 0}', "reward")
    assert reward == 0.5 and details["rule"] == "mean"
    for text, data in ((None, None), ("pass", None), (None, "[1]"), (None, '{"a": "x"}'), (None, "{")):
        with pytest.raises(EvaluationError):
            reward_from(text, data, "reward")


def test_polar_tasks_import_harbor_writes_every_task_or_nothing(tmp_path: Path, capsys):
    """The command as a user runs it: the dataset's TaskRequests in one JSON file ``polar run`` reads; a folder with
    one broken task is an error naming it (exit 2), and no file is written."""
    from polar.cli import main

    out = tmp_path / "tasks.json"
    argv = ["tasks", "import", "harbor", str(DATASET), "--harness", "codex", "--samples", "2", "--out", str(out)]
    assert main(argv) in (0, None)
    requests = json.loads(out.read_text())
    assert sorted(r["name"] for r in requests) == sorted(t.task_id for t in load_harbor([DATASET]))
    assert {r["num_samples"] for r in requests} == {2} and {r["harness"]["name"] for r in requests} == {"codex"}
    assert load_tasks(out) == requests  # what polar run reads

    for name in ("hello-file", "log-errors"):
        shutil.copytree(DATASET / name, tmp_path / "set" / name)
    (tmp_path / "set" / "log-errors" / "instruction.md").unlink()
    broken_out = tmp_path / "broken.json"
    assert main(["tasks", "import", "harbor", str(tmp_path / "set"), "--out", str(broken_out)]) == 2
    assert "log-errors: instruction.md" in capsys.readouterr().err and not broken_out.exists()


def test_a_multi_container_task_is_refused_saying_why(task_dir: Path):
    (task_dir / "environment" / "docker-compose.yaml").write_text("services:\n  db:\n    image: postgres\n")
    error = _error(task_dir)
    assert (
        error.field == "environment/docker-compose.yaml" and "multi-container tasks are not supported" in error.message
    )
