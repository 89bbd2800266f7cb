"""The yarn backend's pure parts: the service spec (checked against the stand-in's copy of the
YARN Service schema), the encoding of values through YARN's substitutions and the NodeManager's
launch script (round-tripped through a real bash), the state -> exit code mapping and the dry run.
The follower is tests/launchkit/test_yarnrun.py's, the REST client's cleanup command
test_yarnrest.py's."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

import dmlc_env
from launchkit.backends.yarn import YarnBackend
from launchkit.backends.yarnspec import (
    YarnOptions,
    app_code,
    app_id_of,
    container_code,
    instance_task,
    launch_command,
    lifetime_for,
    memory_mb,
    parse_file,
    redacted,
    script_value,
    service_name,
    service_spec,
)
from launchkit.core.spec import LOCALHOST, LaunchSpec
from launchkit.errors import UsageError
from launchkit.hostside import shim
from tests.cluster.yarn_standin import (
    LaunchError,
    SpecError,
    launch_script,
    nm_expand,
    substitute,
    validate_service,
)
from tests.launchkit.plans import make_plan

pytestmark = pytest.mark.timeout(20)

HOSTILE = [
    "a b'c\"$HOME\n`x`",
    "${COMPONENT_ID} ${USER} ${DMLC_ROLE} $$ $1 ${",
    "{{HOME}} }} {{ }",
    "<LOG_DIR> <CPS> <",
    'back\\slash \\$ \\" end\\',
    "",
    " lead and trail ",
    "tab\there; rm -rf / && echo pwned | cat > x",
    "ünïcødé ✓",
    '{"json": [1, {"a": "b"}]}',
]
TOKENS = {"${COMPONENT_ID}": "7", "${USER}": "bob", "${DOMAIN}": "example.test", "${SERVICE_NAME}": "lk-x"}


def plan_for(n: int = 2, s: int = 2, command: tuple[str, ...] = ("python3", "t.py", *HOSTILE), **kw):
    spec = LaunchSpec(
        num_workers=n,
        num_servers=s,
        command=command,
        backend="yarn",
        env=(("HOSTILE", HOSTILE[0]),),
        cwd="/work dir/$x",
        **kw,
    )
    return make_plan(
        spec,
        job_id="1123-011611-01551a",
        secret="topsecret",
        root_uri="",
        root_port=0,
        node_host_of={LOCALHOST: ""},
    )


def no_fs(src: str):  # validation without files: every src_file "exists"
    return "/"


def through_yarn_env(raw: str, extra_tokens: dict[str, str] | None = None) -> str:
    """What a container sees for a configuration.env value: the AM's substitutions, the
    NodeManager's expansions, and bash running ``export NAME="VALUE"``."""
    value = nm_expand(substitute(raw, {**TOKENS, **(extra_tokens or {})}), "/logs")
    script = launch_script({"V": value}, r"printf %s \"\$V\"", "/dev")
    script = script.replace(" 1>/dev/stdout.txt 2>/dev/stderr.txt", "")
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout


def through_yarn_command(raw: str, env: dict[str, str]) -> list[str]:
    """The argv a container's launch_command runs, after the AM (tokens, the env's names too), the
    NodeManager's expansions and its ``exec /bin/bash -c "..."`` line."""
    tokens = {**TOKENS, **{f"${{{k}}}": v for k, v in env.items()}}
    command = nm_expand(substitute(raw, tokens), "/logs")
    script = f'exec /bin/bash -c "{command}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


# -- the spec ----------------------------------------------------------------------------------
def test_one_component_per_role_with_counts_resources_and_restart_never() -> None:
    plan = plan_for(n=3, s=2)
    opts = YarnOptions(
        python="/py", queue="prod", cpus_per_worker=4, mem_per_worker="2G", mem_per_server="512M"
    )
    spec = service_spec(plan, opts, lifetime=700)
    validate_service(spec, no_fs)
    assert spec["name"] == "lk-1123-011611-01551a" and spec["queue"] == "prod" and spec["lifetime"] == 700
    comps = {c["name"]: c for c in spec["components"]}
    assert list(comps) == ["scheduler", "server", "worker"]
    assert [comps[r]["number_of_containers"] for r in comps] == [1, 2, 3]
    assert all(c["restart_policy"] == "NEVER" for c in comps.values())
    assert "dependencies" not in comps["scheduler"]
    assert comps["server"]["dependencies"] == comps["worker"]["dependencies"] == ["scheduler"]
    assert comps["scheduler"]["resource"] == {"cpus": 1, "memory": "1024"}
    assert comps["server"]["resource"] == {"cpus": 1, "memory": "512"}
    assert comps["worker"]["resource"] == {"cpus": 4, "memory": "2048"}
    offsets = [c["configuration"]["env"]["LAUNCHKIT_SHIM_OFFSET"] for c in comps.values()]
    assert offsets == ["0", "1", "3"]
    assert all(c["configuration"]["env"]["COMPONENT_ID"] == "${COMPONENT_ID}" for c in comps.values())
    assert json.loads(json.dumps(spec)) == spec  # plain JSON


def test_shim_rank_is_offset_plus_component_id_for_every_container() -> None:
    plan = plan_for(n=3, s=2)
    spec = service_spec(plan, YarnOptions(python="/py"))
    for comp in spec["components"]:
        env = comp["configuration"]["env"]
        for i in range(comp["number_of_containers"]):
            seen = {k: through_yarn_env(v, {"${COMPONENT_ID}": str(i)}) for k, v in env.items()}
            index, own = shim.task_of(seen)
            task = plan.tasks[index]
            assert (task.role, task.rank) == (comp["name"], i)
            assert own["DMLC_ROLE"] == comp["name"] and own["LAUNCHKIT_ROLE_RANK"] == str(i)
            assert own["DMLC_TASK_ID"] == task.env["DMLC_TASK_ID"]
            assert seen["HOSTILE"] == HOSTILE[0] and seen["LAUNCHKIT_JOB_SECRET"] == "topsecret"


def test_scheduler_address_is_the_registry_dns_name_and_a_fixed_port() -> None:
    plan = plan_for()
    env = service_spec(plan, YarnOptions())["components"][1]["configuration"]["env"]
    assert env["DMLC_PS_ROOT_URI"] == "scheduler-0.lk-1123-011611-01551a.${USER}.${DOMAIN}"
    assert through_yarn_env(env["DMLC_PS_ROOT_URI"]) == "scheduler-0.lk-1123-011611-01551a.bob.example.test"
    assert env["DMLC_PS_ROOT_PORT"] == "9091"
    env = service_spec(plan, YarnOptions(domain="ycluster"))["components"][2]["configuration"]["env"]
    assert env["DMLC_PS_ROOT_URI"] == "scheduler-0.lk-1123-011611-01551a.${USER}.ycluster"
    spec = LaunchSpec(num_workers=1, num_servers=1, command=("x",), backend="yarn", scheduler_port=7000)
    plan = make_plan(spec, job_id="j", secret="s", root_uri="", root_port=7000, node_host_of={LOCALHOST: ""})
    assert (
        service_spec(plan, YarnOptions())["components"][0]["configuration"]["env"]["DMLC_PS_ROOT_PORT"]
        == "7000"
    )


@pytest.mark.parametrize("value", HOSTILE)
def test_env_values_survive_yarn_and_the_launch_script(value: str) -> None:
    assert through_yarn_env(script_value(value)) == value


def test_launch_command_survives_yarn_and_bash_with_hostile_arguments() -> None:
    plan = plan_for(command=("python3", "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *HOSTILE))
    spec = service_spec(plan, YarnOptions(python="/usr/bin/env"))
    comp = spec["components"][2]
    command = comp["launch_command"]
    for bad in ("${", "{{", "}}", "<LOG_DIR>", "<CPS>"):  # nothing left for YARN to replace
        assert bad not in command
    argv = ["/usr/bin/env", "-m", "launchkit.hostside.shim", "--", *plan.tasks[0].argv]
    # run it without the shim: drop "-m launchkit.hostside.shim --" (same quoting, one word each)
    raw = launch_command(["python3", *argv[5:]])
    assert through_yarn_command(raw, comp["configuration"]["env"]) == list(HOSTILE)
    assert command.startswith("/usr/bin/env -m launchkit.hostside.shim -- python3 -c ")


def test_values_live_only_in_the_env_and_the_secret_only_where_needed() -> None:
    spec = service_spec(plan_for(), YarnOptions(python="/py"))
    for comp in spec["components"]:
        assert "topsecret" not in comp["launch_command"]
        table = through_yarn_env(comp["configuration"]["env"][shim.TASKS_VAR])
        assert "topsecret" not in table and "HOSTILE" not in table  # shared values are not rows
    shown = json.dumps(redacted(spec))
    assert "topsecret" not in shown and dmlc_env.SECRET_PLACEHOLDER in shown


def test_shipped_files_gpus_and_no_empty_components() -> None:
    plan = plan_for(n=2, s=0, gpus_per_worker=2)
    opts = YarnOptions(files=("hdfs:///user/me/data.tar.gz#data", "hdfs://nn:8020/user/me/cfg.txt"))
    spec = service_spec(plan, opts, gpus_per_worker=2)
    validate_service(spec, no_fs)
    comps = {c["name"]: c for c in spec["components"]}
    assert list(comps) == ["scheduler", "worker"]  # no server component with 0 containers
    assert comps["worker"]["configuration"]["env"]["LAUNCHKIT_SHIM_OFFSET"] == "1"
    assert comps["worker"]["configuration"]["files"] == [
        {"type": "ARCHIVE", "src_file": "hdfs:///user/me/data.tar.gz", "dest_file": "data"},
        {"type": "STATIC", "src_file": "hdfs://nn:8020/user/me/cfg.txt", "dest_file": "cfg.txt"},
    ]
    assert comps["worker"]["resource"]["additional"] == {"yarn.io/gpu": {"value": 2, "unit": ""}}
    table = through_yarn_env(comps["worker"]["configuration"]["env"][shim.TASKS_VAR])
    assert "CUDA_VISIBLE_DEVICES" not in table  # YARN's GPU isolation sets it


@pytest.mark.parametrize(
    "job_id",
    ["1123-011611-01551a", "My_Job.ID", "9starts-with-digit", "x" * 200, "--", "UPPER-CASE_and.dots"],
)
def test_service_names_follow_yarns_pattern(job_id: str) -> None:
    name = service_name(job_id)
    assert re.match(r"^[a-z][a-z0-9-]*$", name) and len(name) <= 63 and not name.endswith("-")
    validate_service({"name": name, "version": "1", "components": [_tiny()]}, no_fs)


def _tiny() -> dict:
    return {
        "name": "c",
        "number_of_containers": 1,
        "launch_command": "true",
        "resource": {"cpus": 1, "memory": "1"},
    }


def test_the_stand_in_refuses_what_the_rm_refuses() -> None:
    good = {"name": "lk-a", "version": "1", "components": [_tiny()]}
    validate_service(good, no_fs)
    bad = [
        ({**good, "name": "Lk_A"}, "'_'"),
        ({**good, "name": "1abc"}, "[a-z]"),
        ({**good, "name": "a" * 64}, "63"),
        ({**good, "version": ""}, "Version"),
        ({**good, "components": []}, "No component"),
        ({**good, "surprise": 1}, "Unrecognized"),
        ({**good, "lifetime": "3600"}, "integer"),
        ({**good, "state": "STOPPED"}, "state"),
        ({**good, "components": [{**_tiny(), "memory": "1"}]}, "Unrecognized"),
        ({**good, "components": [{**_tiny(), "resource": {"cpus": 1, "memory": "1G"}}]}, "memory"),
        ({**good, "components": [{**_tiny(), "resource": {"cpus": 0, "memory": "1"}}]}, "cpus"),
        ({**good, "components": [{**_tiny(), "restart_policy": "never"}]}, "restart_policy"),
        ({**good, "components": [{**_tiny(), "dependencies": ["nope"]}]}, "Dependency"),
        ({**good, "components": [{**_tiny(), "name": "lk-a"}]}, "same as service"),
        ({**good, "components": [_tiny(), _tiny()]}, "collision"),
        ({**good, "components": [{**_tiny(), "launch_command": ""}]}, "launch_command"),
        ({**good, "components": [{**_tiny(), "configuration": {"env": {"A-B": "x"}}}]}, "export"),
        ({**good, "components": [{**_tiny(), "configuration": {"env": {"A": 1}}}]}, "string"),
        (
            {
                **good,
                "components": [
                    {**_tiny(), "configuration": {"files": [{"type": "STATIC", "dest_file": "x"}]}}
                ],
            },
            "src_file",
        ),
        (
            {
                **good,
                "components": [
                    {
                        **_tiny(),
                        "configuration": {
                            "files": [{"type": "STATIC", "src_file": "hdfs:///a", "dest_file": "d/x"}]
                        },
                    }
                ],
            },
            "path element",
        ),
        (
            {
                **good,
                "components": [
                    {**_tiny(), "name": "a", "dependencies": ["b"]},
                    {**_tiny(), "name": "b", "dependencies": ["a"]},
                ],
            },
            "cycle",
        ),
    ]
    for body, why in bad:
        with pytest.raises(SpecError, match=re.escape(why)):
            validate_service(body, no_fs)


def test_javas_replace_all_breaks_on_dollar_replacements_as_yarn_would() -> None:
    with pytest.raises(LaunchError):
        substitute("run ${X}", {"${X}": "a$b"})
    assert substitute("run $''{X}", {"${X}": "a$b"}) == "run $''{X}"


# -- options -----------------------------------------------------------------------------------
def test_memory_sizes() -> None:
    assert (
        memory_mb("4G", 1, "f") == 4096
        and memory_mb("512M", 1, "f") == 512
        and memory_mb("512m", 1, "f") == 512
    )
    assert (
        memory_mb("1.5g", 1, "f") == 1536
        and memory_mb("2048", 1, "f") == 2048
        and memory_mb(None, 7, "f") == 7
    )
    assert memory_mb("1GiB", 1, "f") == 1024 and memory_mb("1T", 1, "f") == 1024 * 1024
    assert memory_mb("100K", 1, "f") == 1
    for bad in ("lots", "-1G", "4X", "0"):
        with pytest.raises(UsageError):
            memory_mb(bad, 1, "--mem-per-worker")


def test_shipped_file_syntax() -> None:
    assert (
        parse_file("hdfs:///u/me/x.zip").type == "ARCHIVE"
        and parse_file("hdfs:///u/me/x.zip").dest == "x.zip"
    )
    f = parse_file("viewfs://cluster/u/me/weights.bin#w.bin")
    assert (f.src, f.dest, f.type) == ("viewfs://cluster/u/me/weights.bin", "w.bin", "STATIC")
    for bad in ("/home/me/data.txt", "data.txt", "hdfs:///", "hdfs:///a#../x", "hdfs:///a#x y", "hdfs:///a#"):
        with pytest.raises(UsageError):
            parse_file(bad)
    with pytest.raises(UsageError, match="upload it first"):
        parse_file("./train.py")


def test_option_defaults_and_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YARN_RM_URL", "http://rm.example:8088/")
    monkeypatch.setenv("USER", "alice")
    opts = YarnOptions()
    assert opts.base_url == "http://rm.example:8088" and opts.user_name == "alice"
    assert YarnOptions(rm_url="https://x:8090", user="bob").base_url == "https://x:8090"
    monkeypatch.delenv("YARN_RM_URL")
    assert YarnOptions().base_url == "http://localhost:8088"
    for bad in (
        YarnOptions(rm_url="rm:8088"),
        YarnOptions(cpus_per_worker=0),
        YarnOptions(mem_per_server="much"),
        YarnOptions(files=("/local/file",)),
        YarnOptions(files=("hdfs:///a/x", "hdfs:///b/x")),
        YarnOptions(domain="bad domain"),
    ):
        with pytest.raises(UsageError):
            YarnBackend(yarn=bad)
    assert YarnBackend(yarn=YarnOptions(python="/a"), node_python="/b").opts.python == "/b"


def test_lifetime_is_a_backstop_past_the_time_limit() -> None:
    assert lifetime_for(None, 5) is None and lifetime_for(100, 5) == 165 and lifetime_for(0.5, 0) == 61


# -- states -> exit codes, containers -> tasks ----------------------------------------------------
def test_state_mapping() -> None:
    assert instance_task("worker-12") == ("worker", 12) and instance_task("scheduler-0") == ("scheduler", 0)
    assert (
        instance_task("other-1") is None
        and instance_task("worker") is None
        and instance_task("worker-x") is None
    )
    assert container_code("SUCCEEDED", False) == (0, 0) and container_code("FAILED", True) == (1, 0)
    assert container_code("STOPPED", False) == (143, 0) and container_code("STOPPED", True) == (143, 1)
    assert container_code("READY", False) is None and container_code("RUNNING_BUT_UNREADY", False) is None
    assert app_code("SUCCEEDED") == 0 and app_code("FAILED") == 1 and app_code("KILLED") == 143
    assert (
        app_code("KILLED", "Application is killed by ResourceManager as it has exceeded the lifetime period.")
        == 124
    )
    assert app_code("ENDED") == 143 and app_code("UNDEFINED") == 1
    assert (
        app_id_of({"diagnostics": "Application ID: application_1700000000000_0042"})
        == "application_1700000000000_0042"
    )
    assert app_id_of({}) is None


def test_dry_run_shows_the_spec_without_the_secret() -> None:
    backend = YarnBackend(yarn=YarnOptions(rm_url="http://rm:8088", user="me", python="/py"))
    plan = plan_for()
    notes = "\n".join(backend.notes(plan))
    assert "lk-1123-011611-01551a" in notes and "topsecret" not in notes and "<hidden>" in notes
    assert "scheduler-0.lk-1123-011611-01551a.${USER}.${DOMAIN}:9091" in notes
    (curl,) = backend.describe_job(plan)
    assert curl[-1] == "http://rm:8088/app/v1/services?user.name=me"
    assert backend.describe(plan.tasks[1])[:4] == ["/py", "-m", "launchkit.hostside.shim", "--"]
