"""dgx_stage.cli and dgx_stage.run without a playbook: arguments and their validation (exit 64), the
ansible-playbook arguments each subcommand passes, the exit code of a finished run (0, 1, 2, 99), the
forwarding of the first Ctrl-C to ansible-playbook's process group, and `report`'s lookup of runs."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import processes

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this tree's
from dgx_stage import cli, extravars, run, runs  # noqa: E402
from dgx_stage.events import RunState  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "frontend")
INVENTORY = """all:
  children:
    exl3_2x:
      hosts:
        rank0: {ansible_connection: local}
        rank1: {ansible_connection: local}
"""


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return str(path)


# The tests' stand-in secrets: kept out of a failure message too.
SECRET = re.compile(r"hf_SECRET\w*|aGZfU0VDUkVU|deadbeefcafe0123")


def masked(text):
    return SECRET.sub("<secret>", text)


def refused(argv, capsys):
    """(exit code, stdout, stderr with the stand-in secrets masked, whether stderr showed one)."""
    code, out, err = main(argv, capsys)
    return code, out, masked(err), bool(SECRET.search(err))


def main(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- arguments ---------------------------------------------------------------------------------------------

def test_each_playbook_subcommand_takes_the_common_options():
    for name in ("stage", "verify", "clean-receipts", "serve", "status"):
        args = cli.build_parser().parse_args([name, "-i", "inv", "--limit", "rank0", "-e", "a=1", "-e", "@vars.yml",
                                              "--check", "-vv"])
        assert (args.command, args.inventory, args.limit, args.extra_vars, args.check, args.verbose) == (
            name, "inv", "rank0", ["a=1", "@vars.yml"], True, 2)


def test_subcommands_run_their_tags_of_the_playbooks():
    assert cli.SUBCOMMANDS["stage"][:2] == ("stage-deepseek.yml", "preflight,stage,verify,manifest")
    assert cli.SUBCOMMANDS["verify"][:2] == ("stage-deepseek.yml", "verify")
    assert cli.SUBCOMMANDS["clean-receipts"][:2] == ("stage-deepseek.yml", "receipts")
    assert cli.SUBCOMMANDS["serve"][:2] == ("stage-deepseek.yml", "preflight,receipts,manifest,engine,smoke")
    assert cli.SUBCOMMANDS["status"][:2] == (os.path.join("playbooks", "status.yml"), None)
    for playbook, _tags, _help in cli.SUBCOMMANDS.values():
        assert os.path.isfile(os.path.join(cli.REPO, playbook)) or playbook.endswith("status.yml")


def test_live_is_offered_where_stage_or_verify_runs_and_sets_stage_live(inventory, monkeypatch):
    for name in ("stage", "verify"):
        assert cli.build_parser().parse_args([name, "--live"]).live is True
    for name in ("serve", "clean-receipts", "status"):
        with pytest.raises(cli.UsageError, match="unrecognized arguments: --live"):
            cli.build_parser().parse_args([name, "--live"])
    ran = []
    monkeypatch.setattr(run.PlaybookRun, "run", lambda self: ran.append(self.spec) or 0)
    assert cli.main(["stage", "-i", inventory, "--live", "-e", "stage_verify=full"]) == 0
    assert ran[0]["extra_vars"] == ["stage_verify=full", "stage_live=true"]


def test_the_runner_command_line_quotes_values_and_adds_diff_to_check():
    line = run.runner_cmdline("verify", "rank0,rank1", ["stage_verify=full", "msg='a b'", "@/x y.yml"], True, 3)
    assert line == ("--tags verify --limit rank0,rank1 -e stage_verify=full -e 'msg='\"'\"'a b'\"'\"'' "
                    "-e '@/x y.yml' --check --diff -vv")
    assert run.runner_cmdline(None, None, [], False, 1) == ""   # -v streams the output, ansible stays quiet


def test_inline_extra_vars_reach_ansible_in_private_files_and_are_recorded_by_name_only(tmp_path):
    """An -e value can be a token: on ansible-playbook's command line it would land in ansible-runner's
    `command` artifact, in `ps` and in run.json."""
    secret = "hf_plantedSECRET"
    (tmp_path / "v.yml").write_text("a: 1\n")
    values = ['{"engine_env": {"HF_TOKEN": "%s"}}' % secret, "stage_verify=full token=%s" % secret,
              "@" + str(tmp_path / "v.yml")]
    files = extravars.as_files(values, str(tmp_path / "private"))
    assert files[2] == values[2]
    assert oct(os.stat(str(tmp_path / "private")).st_mode & 0o777) == "0o700"
    for path, expected in zip(files[:2], [{"engine_env": {"HF_TOKEN": secret}},
                                          {"stage_verify": "full", "token": secret}]):
        assert oct(os.stat(path[1:]).st_mode & 0o777) == "0o600"
        assert extravars.variables_of(path) == expected
    assert secret not in run.runner_cmdline("serve", None, files, True, 2)
    # Every spelling argparse reads as -e is recorded the same way: stacked, attached, with `=`.
    for given in (["-e", values[0]], ["--extra-vars", values[0]], ["--extra-vars=" + values[0]], ["-e" + values[0]],
                  ["-e=" + values[0]], ["-ve", values[0]], ["-vve" + values[0]]):
        argv = ["serve", "-i", "inv"] + given + ["--extra-vars=" + values[1], "-e" + values[2], "-v"]
        recorded = [extravars.described(value) for value in cli.build_parser().parse_args(argv).extra_vars]
        assert recorded == ["engine_env (values not recorded)", "stage_verify, token (values not recorded)",
                            values[2]], given
    # A prefix of --extra-vars is no option at all, and the refusal shows none of the values.
    for given in (["--extra", values[0]], ["--extra-var=" + values[0]], ["--extra-v", values[1]]):
        with pytest.raises(cli.UsageError, match="unrecognized arguments: --extra") as refused:
            cli.build_parser().parse_args(["serve"] + given)
        assert secret not in str(refused.value), given


def test_the_next_run_sweeps_the_extra_vars_files_a_killed_run_left_and_keeps_a_live_runs(tmp_path):
    """A front end killed with SIGKILL cannot remove its -e files, which may hold a token."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    reused = dict(runs.this_process(), status="running")
    reused["pid_started"] -= 1      # a killed front end whose pid another process has now
    records = {"live": dict(runs.this_process(), status="running"), "killed": {"status": "running", "pid": dead.pid},
               "reused": reused, "ended": {"status": "ok", "pid": os.getpid()}, "unrecorded": None}
    for name, record in records.items():
        (tmp_path / name / runs.EXTRA_VARS).mkdir(parents=True)
        (tmp_path / name / runs.EXTRA_VARS / "extra-vars-0.json").write_text('{"token": "hf_plantedSECRET"}')
        if record is not None:
            (tmp_path / name / "run.json").write_text(json.dumps(record))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.json").write_text("{}")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / runs.EXTRA_VARS).symlink_to(outside)
    assert runs.sweep_extra_vars(str(tmp_path)) == ["ended", "killed", "reused", "unrecorded"]
    assert [n for n in sorted(os.listdir(str(tmp_path))) if (tmp_path / n / runs.EXTRA_VARS).exists()] == [
        "linked", "live"]
    assert (outside / "keep.json").exists()
    assert runs.sweep_extra_vars(str(tmp_path / "absent")) == []


def test_bad_arguments_exit_64(capsys):
    for argv in ([], ["bogus"], ["stage", "--frob"], ["report", "a", "b"]):
        code, _out, err = main(argv, capsys)
        assert code == 64 and err.startswith("dgx-stage: ") and "usage:" in err, (argv, err)


def test_argument_errors_never_quote_what_was_given(capsys):
    """An -e before the command is read as the command: argparse would quote it, and with it any token."""
    for argv, said in ((["-e", 'engine_env={"HF_TOKEN": "hf_SECRET"}', "verify"],
                        "argument COMMAND: not a command (what was given is not shown: it may hold a secret); the "
                        "commands: stage, verify, clean-receipts, serve, status, report; options such as -e go "
                        "after the command"),
                       (["verify", "--check=hf_SECRET"], "argument --check: takes no value (what was given is not "
                                                         "shown"),
                       (["report", "--markdown=hf_SECRET"], "argument --markdown: takes no value")):
        code, out, err, leaked = refused(argv, capsys)
        assert code == 64 and out == "" and err.startswith("dgx-stage: " + said), err
        assert not leaked, "a value given is shown"
    assert cli.without_arguments("argument --n: invalid int value: 'hf_SECRET'") == (
        "argument --n: not a valid int value (what was given is not shown: it may hold a secret)")
    assert cli.without_arguments("ambiguous option: --x=hf_SECRET could match --xa, --xb") == (
        "ambiguous option (what was given is not shown: it may hold a secret): it could be --xa, --xb")


def test_a_missing_inventory_exits_64_naming_it(tmp_path, capsys):
    missing = str(tmp_path / "nope")
    code, out, err = main(["stage", "-i", missing], capsys)
    assert code == 64 and err == "dgx-stage: inventory not found: %s\n" % missing and out == ""


def test_the_default_inventory_comes_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DGX_STAGE_INVENTORY", str(tmp_path / "from-env"))
    code, _out, err = main(["status"], capsys)
    assert code == 64 and str(tmp_path / "from-env") in err


@pytest.mark.parametrize("subcommand", ["stage", "verify", "clean-receipts", "serve", "status"])
def test_without_an_inventory_every_subcommand_refuses_and_lists_the_repos_inventories(subcommand, tmp_path,
                                                                                       monkeypatch, capsys):
    """A forgotten -i never falls back to production."""
    monkeypatch.delenv("DGX_STAGE_INVENTORY", raising=False)
    code, out, err = main([subcommand, "--runs-dir", str(tmp_path / "runs")], capsys)
    assert code == 64 and out == "", err
    assert "no inventory: pass -i INVENTORY or set DGX_STAGE_INVENTORY" in err, err
    assert "inventory/demo, inventory/demo-4x, inventory/dgx" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_missing_extra_vars_file_exits_64(inventory, tmp_path, capsys):
    code, _out, err = main(["verify", "-i", inventory, "-e", "@%s" % (tmp_path / "vars.yml")], capsys)
    assert code == 64 and "extra vars file not found" in err


def test_extra_vars_that_do_not_parse_exit_64_naming_them(inventory, tmp_path, capsys):
    # ansible-playbook stops on them with exit 1 and a YAML error in its log, after the run was recorded.
    # The -e is named by its place, never by its text: a token pasted with a missing quote stays unshown.
    (tmp_path / "bad.yml").write_text("a: 1\nb: [hf_SECRET\n")
    (tmp_path / "list.yml").write_text("- hf_SECRET\n")
    (tmp_path / "scalar.yml").write_text("hf_SECRET\n")
    (tmp_path / "number.yml").write_text("42\n")
    for value, said in (('{"engine_env": {"HF_TOKEN": "hf_SECRET"}', "the 2nd -e does not parse as JSON or YAML "
                                                                     "(at its end: a bracket or a quote is not closed)"),
                        ('engine_command="--api-key hf_SECRET', "the 2nd -e does not parse as NAME=VALUE pairs"),
                        ("[1, 2]", "the 2nd -e is not a mapping of variables (a list)"),
                        ("@%s" % (tmp_path / "bad.yml"), "the 2nd -e (%s) does not parse as JSON or YAML (line 3, "
                                                         "column 1)" % (tmp_path / "bad.yml")),
                        ("@%s" % (tmp_path / "list.yml"), "the 2nd -e (%s) is not a mapping of variables (a list)"
                                                          % (tmp_path / "list.yml")),
                        ("@%s" % (tmp_path / "scalar.yml"), "the 2nd -e (%s) is not a mapping of variables (a "
                                                            "string)" % (tmp_path / "scalar.yml")),
                        ("@%s" % (tmp_path / "number.yml"), "the 2nd -e (%s) is not a mapping of variables (a "
                                                            "number)" % (tmp_path / "number.yml"))):
        code, out, err, leaked = refused(["stage", "-i", inventory, "-e", "stage_verify=full", "-e", value,
                                          "--runs-dir", str(tmp_path / "runs")], capsys)
        assert code == 64 and said in err and out == "", (masked(value), err)
        assert not leaked and "[1, 2]" not in err, err
    assert not (tmp_path / "runs").exists()
    good = ['{"a": "b c", "q": "it\'s"}', 'a=1 b="x y"', ' {key=value for Ansible']
    assert extravars.resolve(good) == good


def test_inline_extra_vars_reach_ansible_as_they_were_given_and_untrusted_so_never_templated(tmp_path):
    """Ansible trusts an @file's strings as templates, an inline -e's not: a {{ in a value written to the run's
    file would be templated and pieces of a token shown in the error."""
    from ansible._internal._datatag._tags import TrustedAsTemplate
    from ansible.template import Templar
    given = {"engine_env": {"HF_TOKEN": "hf_{{ planted }}", "N": "123", "E": "", "B": "true", "M": "<<",
                            "U": "\xe9\U0001f600\u2028\x00\t\n  x "},
             "engine_command": ["serve", "{% raw %}", 8, 2.5, None, True], "1": "a"}
    path = extravars.as_files([json.dumps(given)], str(tmp_path / "private"))[0][1:]
    # As ansible.utils.vars.load_extra_vars reads an @file.
    loader = extravars._loader()
    data = loader.load_from_file(path, trusted_as_template=True)
    assert data == given
    # "123", "true", "" and "<<" go untagged (!unsafe would read them as other types) and hold no {.
    strings = [data["1"], data["engine_command"][1], data["engine_env"]["HF_TOKEN"], data["engine_env"]["U"]]
    assert not any(TrustedAsTemplate.is_tagged_on(value) for value in strings)
    assert Templar(loader=loader, variables={"planted": "x"}).template(data) == given


def test_an_inline_extra_var_json_cannot_carry_exits_64_naming_it_not_its_value(inventory, tmp_path, capsys):
    """An inline -e reaches ansible-playbook as JSON (extravars.as_files): a YAML date or a binary value there was
    a traceback (exit 1) after the run was recorded."""
    for value, name in (("{stage_reserve: 2024-01-01}", "stage_reserve"),
                        ("{engine_command: !!binary aGZfU0VDUkVU}", "engine_command")):
        code, out, err, leaked = refused(["serve", "-i", inventory, "-e", value, "--runs-dir", str(tmp_path / "runs")],
                                         capsys)
        assert code == 64 and out == "", err
        assert err.startswith("dgx-stage: the 1st -e: %s is a YAML date or binary value" % name), err
        assert not leaked and "2024" not in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()
    # In a file ansible-playbook reads them itself, as it does a tag that needs no secret.
    (tmp_path / "tagged.yml").write_text("stage_reserve: 2024-01-01\nengine_command: !unsafe '{{ x }}'\n")
    assert extravars.resolve(["@%s" % (tmp_path / "tagged.yml")]) == ["@%s" % (tmp_path / "tagged.yml")]


VAULTED = "$ANSIBLE_VAULT;1.1;AES256\ndeadbeefcafe0123\n"


def test_a_vault_value_or_file_exits_64_as_no_vault_password_is_passed(inventory, tmp_path, capsys):
    """ansible-playbook without a vault password stops on a !vault value and quotes its line in the run's log."""
    nested, whole = tmp_path / "nested.yml", tmp_path / "whole.yml"
    nested.write_text("stage_verify: full\nengine_env:\n  HF_TOKEN: !vault |\n    %s" % VAULTED.replace("\n", "\n    "))
    whole.write_text(VAULTED)
    for value, said in (("@%s" % nested, "the 2nd -e (%s): engine_env holds a !vault value; dgx-stage passes no "
                                         "vault password to ansible-playbook: give the value in plain text in an -e "
                                         "@FILE only you can read" % nested),
                        ("@%s" % whole, "the 2nd -e (%s) is vault-encrypted; dgx-stage passes no vault password"
                                        % whole),
                        ("{engine_env: {HF_TOKEN: !vault hf_SECRET}}", "the 2nd -e: engine_env holds a !vault "
                                                                       "value; dgx-stage passes no vault password")):
        code, out, err, leaked = refused(["serve", "-i", inventory, "-e", "stage_verify=full", "-e", value,
                                          "--runs-dir", str(tmp_path / "runs")], capsys)
        assert code == 64 and out == "" and err.startswith("dgx-stage: " + said), err
        assert not leaked, "the vaulted text is shown"
    assert not (tmp_path / "runs").exists()


def test_a_group_or_host_vars_file_that_does_not_read_exits_64_naming_it_not_its_text(tmp_path, capsys):
    """Read for the -e check on every subcommand: Ansible's error was a traceback (exit 1)."""
    for name, text, said in (("broken", "a: 1\nb: [hf_SECRET\n", "is not YAML (line 3, column 1)"),
                             ("list", "- hf_SECRET\n", "is not a mapping of variables"),
                             ("scalar", "hf_SECRET\n", "is not a mapping of variables")):
        folder = tmp_path / name
        (folder / "group_vars" / "all").mkdir(parents=True)
        (folder / "hosts.yml").write_text(INVENTORY)
        (folder / "group_vars" / "all" / "a.yml").write_text("site_tuning: 1\n")
        (folder / "group_vars" / "all" / "zz.yml").write_text(text)
        code, out, err, leaked = refused(["status", "-i", str(folder), "--runs-dir", str(tmp_path / "runs")], capsys)
        assert code == 64 and out == "", err
        assert err.startswith("dgx-stage: inventory %s does not parse: %s %s; its text is not shown"
                              % (folder, folder / "group_vars" / "all" / "zz.yml", said)), err
        assert not leaked and "Traceback" not in err, "the file's text is shown"
    (tmp_path / "host" / "host_vars").mkdir(parents=True)
    (tmp_path / "host" / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "host" / "host_vars" / "rank1.yml").write_text(VAULTED)
    code, _out, err, _leaked = refused(["verify", "-i", str(tmp_path / "host"), "--runs-dir", str(tmp_path / "runs")],
                                       capsys)
    assert code == 64 and "is vault-encrypted, and dgx-stage passes no vault password" in err, err
    assert not (tmp_path / "runs").exists()


def test_report_says_why_the_front_end_stopped_a_run(recorded, capsys):
    runs_dir, _report_dir = recorded
    ident = "20261201T110000Z-stage-dddd"
    os.makedirs(os.path.join(runs_dir, ident))
    runs.write_json(os.path.join(runs_dir, ident, "run.json"), {
        "ident": ident, "subcommand": "stage", "run_id": None, "reports": {}, "started": "2026-12-01T11:00:00Z",
        "status": "error", "exit_code": 1, "error": "dgx-stage failed: RuntimeError: display broke"})
    for markdown in ([], ["--markdown"]):
        code, out, _err = main(["report", "--runs-dir", runs_dir] + markdown, capsys)
        assert code == 0 and "dgx-stage failed: RuntimeError: display broke" in out, out


@pytest.mark.parametrize("value,said", [
    ("stage_verfy=full", "-e stage_verfy: no play or role reads stage_verfy; did you mean stage_verify?"),
    ("stage_verify", "-e stage_verify has no value: write NAME=VALUE"),
    ("stage_verfy", "-e stage_verfy has no value: write NAME=VALUE"),
    ("hf_SECRETX", "the 1st -e is a word without =VALUE (not shown: it may be a secret): write NAME=VALUE"),
    ("{hf_SECRETK3}", "the 1st -e sets a name no play or role reads (not shown: it may be a secret"),
    ("_hf_SECRET=1", "the 1st -e sets a name starting with _ (not shown)"),
    ("stage_verify=hf_SECRET", "-e stage_verify: stage_verify is one of sample, full, none"),
    ("engine_bind_form=nas", "-e engine_bind_form: no play or role reads engine_bind_form; did you mean "
                             "engine_bind_from?"),
    ("engine_stop_strays=hf_SECRET", "-e engine_stop_strays: engine_stop_strays is true or false"),
    ("stage_workers=hf_SECRET", "-e stage_workers: stage_workers is a whole number"),
    ('{"engine_decode_floor": "hf_SECRET"}', "-e engine_decode_floor: engine_decode_floor is a finite number"),
    ("engine_decode_floor=nan", "-e engine_decode_floor: engine_decode_floor is a finite number"),
    ("{engine_decode_floor: -.inf}", "-e engine_decode_floor: engine_decode_floor is a finite number"),
    ("stage_reserve=hf_SECRET", "-e stage_reserve: stage_reserve is bytes, a size such as 500G, or N% of the disk"),
    ("stage_reserve=100%", "-e stage_reserve: stage_reserve is bytes"),
    ("lane=hf_SECRET", "-e lane: lane is an inventory group with hosts of %s: exl3_2x"),
    ("lane=ungrouped", "-e lane: lane is an inventory group with hosts of %s: exl3_2x"),
    ("lane=all", "-e lane: lane is an inventory group with hosts of %s: exl3_2x"),
    ("lane={{ hf_SECRET }}", "-e lane: lane is an inventory group's name, not a template"),
    ("engine_env=hf_SECRET", "-e engine_env: engine_env is a mapping; give it as JSON or YAML"),
    ("engine_command=--api-key hf_SECRET", "the 1st -e holds text that is not NAME=VALUE (not shown: it may be part of a "
                                           "secret value)"),
    ('engine_env={"HF_TOKEN": "hf_SECRET"}', "the 1st -e holds text that is not NAME=VALUE (not shown: it may be part of a "
                                            "secret value)"),
    ("lane_rank=1", "-e lane_rank: the playbooks set lane_rank themselves (it is not an input)"),
    ("dgx_play_failed=true", "-e dgx_play_failed: the playbooks set dgx_play_failed themselves"),
])
def test_an_extra_var_no_play_reads_or_a_bad_value_exits_64_before_anything_runs(inventory, tmp_path, capsys,
                                                                                  value, said):
    """A typo of stage_verify would otherwise run a sample verify and say ok after a disk swap; one of the
    rollback's engine_bind_from would restart the lane on the suspect disks."""
    code, out, err, leaked = refused(["verify", "-i", inventory, "-e", value, "--runs-dir", str(tmp_path / "runs")],
                                     capsys)
    assert code == 64 and out == "", err
    assert (said % inventory if "%s" in said else said) in err, err
    assert not leaked, "a value given is shown"
    assert not (tmp_path / "runs").exists()


def test_a_word_without_a_value_is_not_shown_whichever_spelling_gave_it(inventory, tmp_path, capsys):
    for spelling in (["-e", "hf_SECRETX"], ["-ve", "hf_SECRETX"], ["-e=hf_SECRETX"], ["-ehf_SECRETX"]):
        code, _out, err, leaked = refused(["verify", "-i", inventory, "--runs-dir", str(tmp_path / "runs")] + spelling,
                                          capsys)
        assert code == 64 and "the 1st -e is a word without =VALUE" in err, err
        assert not leaked, "a value given is shown"


def test_known_extra_vars_pass_and_a_sites_own_needs_allow_unknown_vars(inventory, tmp_path):
    fine = ["stage_verify=full", "engine_bind_from=nas", "engine_stop_strays=yes", "stage_workers=8",
            '{"engine_env": {"HF_TOKEN": "x"}, "engine_decode_floor": 12.5}', "lane=exl3_2x", "ansible_user=ops",
            "stage_workers={{ 4 * 2 }}", "stage_reserve=2%", "stage_reserve=500G", '{"stage_reserve": 1000000}']
    assert extravars.problems(fine, extravars.Inventory(inventory)) == []
    (tmp_path / "vars.yml").write_text("site_tuning: 3\n")
    assert extravars.problems(["@%s" % (tmp_path / "vars.yml")], extravars.Inventory(inventory)) == [
        "the 1st -e (%s) sets a name no play or role reads (not shown: it may be a secret; a site's own variable: "
        "--allow-unknown-vars)" % (tmp_path / "vars.yml")]
    assert extravars.problems(["@%s" % (tmp_path / "vars.yml")], extravars.Inventory(inventory),
                              allow_unknown=True) == []
    # --allow-unknown-vars takes a site's own name, not a typo of a role's.
    assert extravars.problems(["stage_verfy=full"], extravars.Inventory(inventory), allow_unknown=True) == [
        "-e stage_verfy: no play or role reads stage_verfy; did you mean stage_verify? (--allow-unknown-vars takes "
        "no name this close to a known one; a site's own variable can be defined in the inventory)"]
    # A variable the inventory defines is the site's to override.
    site = tmp_path / "site.yml"
    site.write_text(INVENTORY.replace("{ansible_connection: local}", "{ansible_connection: local, site_tuning: 1}"))
    assert extravars.problems(["site_tuning=2"], extravars.Inventory(str(site))) == []


def test_a_limit_matching_no_host_exits_64_listing_the_hosts(inventory, capsys):
    code, _out, err = main(["stage", "-i", inventory, "--limit", "dgx9"], capsys)
    assert code == 64 and "--limit dgx9 matches no host of %s (hosts: rank0, rank1)" % inventory in err
    # Patterns are the inventory's: groups, globs and exclusions select hosts.
    loaded = cli.load_inventory(inventory)
    assert loaded.hosts("exl3_2x:!rank1") == ["rank0"]
    assert loaded.hosts("rank*") == ["rank0", "rank1"] and loaded.hosts() == ["rank0", "rank1"]
    cli.load_inventory(inventory, "rank1")   # no error


def test_an_inventory_that_does_not_parse_or_is_empty_exits_64_naming_it(tmp_path, capsys):
    # ansible-playbook alone only warns about a source that does not parse and runs on the hosts of the others
    # (on none, exiting 0, for a single file): that must not read as ok.
    broken, empty, folder = tmp_path / "broken.yml", tmp_path / "empty.yml", tmp_path / "inventory"
    broken.write_text("all: [\n")
    empty.write_text("all: {}\n")
    folder.mkdir()
    (folder / "hosts.yml").write_text(INVENTORY)
    (folder / "site.yml").write_text("all: [\n")
    for path, said in ((broken, "does not parse: Completely failed to parse inventory source %s" % broken),
                       (folder, "does not parse: Completely failed to parse inventory source %s" % (folder / "site.yml")),
                       (empty, "has no host (it is empty)")):
        code, out, err = main(["status", "-i", str(path)], capsys)
        assert code == 64 and out == "", err
        assert err.startswith("dgx-stage: inventory %s %s" % (path, said)) and "pass another with -i" in err, err
    assert cli.load_inventory("rank0,").hosts() == ["rank0"]   # a host list has its hosts


def test_relative_paths_are_made_absolute_for_the_run_in_the_repo(inventory, tmp_path, monkeypatch):
    monkeypatch.chdir(str(tmp_path))
    (tmp_path / "vars.yml").write_text("a: 1\n")
    assert cli.resolve_inventory("hosts.yml") == inventory
    assert extravars.resolve(["a=1", "@vars.yml"]) == ["a=1", "@" + str(tmp_path / "vars.yml")]
    assert cli.resolve_inventory("rank0,") == "rank0,"   # a host list is not a path
    (tmp_path / "retry").write_text("rank1\n")
    assert cli.resolve_limit("@retry") == "@" + str(tmp_path / "retry")   # ansible-playbook runs in the repo
    assert cli.load_inventory(inventory).hosts(cli.resolve_limit("@retry")) == ["rank1"]
    assert cli.resolve_limit("rank*") == "rank*"
    with pytest.raises(cli.UsageError, match="--limit file not found: nope"):
        cli.resolve_limit("@nope")


# --- the end of a run: exit codes ------------------------------------------------------------------------------

class FakeRunner(object):
    def __init__(self, rc, status="successful"):
        self.rc, self.status = rc, status


def finished(tmp_path, state, rc, interrupts=0):
    """(exit code, output, run.json) of PlaybookRun._finish on a run that ended with `state`."""
    spec = {"subcommand": "stage", "playbook": "stage-deepseek.yml", "tags": "stage", "inventory": "i",
            "limit": None, "extra_vars": [], "check": False, "verbose": 0, "cmdline": ""}
    out = io.StringIO()
    playbook_run = run.PlaybookRun(spec, str(tmp_path / "runs"), out=out)
    os.makedirs(playbook_run.run_dir)
    playbook_run.state = state
    playbook_run.interrupts = interrupts
    playbook_run.record["ident"] = playbook_run.ident
    code = playbook_run._finish(FakeRunner(rc), run.Display(out))
    with open(os.path.join(playbook_run.run_dir, "run.json")) as handle:
        return code, out.getvalue(), json.load(handle)


def state_with(report_names=(), failures=None, dark=None):
    state = RunState()
    for name in report_names:
        with open(os.path.join(FIXTURES, name)) as handle:
            report = json.load(handle)
        state.reports[report["host"]] = report
        state.history_paths[report["host"]] = "/r/%s-%s.json" % (report["host"], report["run_id"])
    state.stats = {"failures": failures or {}, "dark": dark or {}}
    return state


def test_all_hosts_ok_exits_0_with_the_table_and_the_artifacts(tmp_path):
    code, out, record = finished(tmp_path, state_with(["report-stage-ok.json"]), 0)
    assert code == 0 and record["status"] == "ok" and record["exit_code"] == 0 and record["rc"] == 0
    assert "localhost  20261201T101737Z-ed44  ok      17/5" in out
    run_dir = os.path.join(str(tmp_path / "runs"), record["ident"])
    assert "artifacts: %s\n" % run_dir in out and "full log: %s/stdout\n" % run_dir in out
    assert record["run_id"] == "20261201T101737Z-ed44" and record["report_dir"] == "/r"
    assert record["reports"] == {"localhost": "/r/localhost-20261201T101737Z-ed44.json"}


def test_a_failed_host_exits_2_naming_host_play_task_and_message(tmp_path):
    state = state_with(["report-stage-ok.json", "report-preflight-failed.json"], failures={"rank1": 1})
    code, out, record = finished(tmp_path, state, 2)
    assert code == 2 and record["status"] == "failed"
    failed = [line for line in out.splitlines() if line.startswith("host ")]
    assert len(failed) == 1 and failed[0].startswith(
        "host rank1 failed in play preflight, task Mirror | Each repo from the NAS hub to the local hub, pass "
        "preflight: One or more items failed")
    assert record["failures"][0]["host"] == "rank1"


def test_the_fix_a_failure_gives_runs_on_the_runs_inventory(tmp_path, capsys):
    """The hosts build the fix without knowing the controller's inventory; pasted without -i it would refuse
    (or run on $DGX_STAGE_INVENTORY)."""
    state = state_with(failures={"dgx1": 1})
    state.failures["dgx1"] = {"host": "dgx1", "play": "engine", "task": "Plan", "msg": "stale: `dgx-stage serve "
                              "--limit dgx1 -e engine_pull=missing`; `dgx-stage report` shows it"}
    code, out, record = finished(tmp_path, state, 2)
    fixed = ("host dgx1 failed in play engine, task Plan: stale: `dgx-stage serve -i i --limit dgx1 -e "
             "engine_pull=missing`; `dgx-stage report` shows it")
    assert code == 2 and fixed in out.splitlines(), out
    # report reads the inventory from run.json; one with a space is quoted.
    runs.write_json(os.path.join(str(tmp_path / "runs"), record["ident"], "run.json"), dict(record, inventory="/my inv"))
    for markdown in ([], ["--markdown"]):
        code, out, _err = main(["report", "--runs-dir", str(tmp_path / "runs")] + markdown, capsys)
        assert "dgx-stage serve -i '/my inv' --limit dgx1" in out.replace("\\", ""), out


def test_an_unreachable_host_exits_2(tmp_path):
    state = state_with(["report-stage-ok.json"], dark={"dgx9": 1})
    state.unreachable["dgx9"] = {"host": "dgx9", "play": "Preflight", "task": "ping", "msg": "no route"}
    code, out, _record = finished(tmp_path, state, 4)
    assert code == 2 and "host dgx9 unreachable in play Preflight, task ping: no route" in out


def test_ansible_failing_without_a_host_result_exits_1_with_the_end_of_its_log(tmp_path):
    state = RunState()
    code, out, record = finished(tmp_path, state, 4)
    assert code == 1 and record["status"] == "error" and "ansible-playbook exited 4 with no host failure" in out


def test_an_interrupted_run_exits_99_whatever_ansible_returned(tmp_path):
    code, out, record = finished(tmp_path, state_with(["report-stage-ok.json"]), 0, interrupts=1)
    assert code == 99 and record["status"] == "interrupted" and "interrupted: exit 99" in out


def test_a_run_over_with_reports_still_running_settles_them_failed_with_the_failure_seen_or_interrupted(
        tmp_path, capsys):
    """A role's argument validation fails the host in a play the tags skip (Ansible tags it `always`): no
    rescue writes the failure, no end-of-run play runs. The run is over: its reports must not read running."""
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    state = state_with(failures={"rank1": 1})
    with open(os.path.join(FIXTURES, "report-stage-ok.json")) as handle:
        fixture = json.load(handle)
    for host in ("rank0", "rank1"):
        report = dict(fixture, host=host, status="running")
        state.reports[host] = report
        state.history_paths[host] = str(report_dir / ("%s-%s.json" % (host, report["run_id"])))
        for path in (state.history_paths[host], str(report_dir / (host + ".json"))):
            runs.write_json(path, report, indent=2)
    state.failures["rank1"] = {"host": "rank1", "play": "Manifest", "task": "Validating arguments",
                               "msg": "value of engine_bind_from must be one of: local, nas, got: bogus"}
    code, out, record = finished(tmp_path, state, 2)
    assert code == 2 and "rank0  20261201T101737Z-ed44  interrupted" in out, out
    assert "rank1  20261201T101737Z-ed44  failed " in out, out
    for host, status in (("rank0", "interrupted"), ("rank1", "failed")):
        for path in (state.history_paths[host], str(report_dir / (host + ".json"))):
            with open(path) as handle:
                assert json.load(handle)["status"] == status, path
    with open(str(report_dir / "rank1.json")) as handle:
        assert json.load(handle)["failed_task"] == "Validating arguments"
    code, out, _err = main(["report", "--runs-dir", str(tmp_path / "runs")], capsys)
    assert "rank1  20261201T101737Z-ed44  failed " in out and "running" not in out, out
    assert ("host rank1 failed in play Manifest, task Validating arguments: value of engine_bind_from must be one "
            "of: local, nas, got: bogus") in out.splitlines(), out


def test_an_interrupted_runs_running_reports_read_interrupted_whatever_failed_before(tmp_path):
    """Before the recap the events still hold failures a rescue handled (a wait round's): no such failure is
    written as the end of a run the operator interrupted."""
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    state = state_with(failures={"rank0": 1})
    state.stats = None
    with open(os.path.join(FIXTURES, "report-stage-ok.json")) as handle:
        report = dict(json.load(handle), host="rank0", status="running")
    state.reports["rank0"] = report
    state.history_paths["rank0"] = str(report_dir / ("rank0-%s.json" % report["run_id"]))
    runs.write_json(state.history_paths["rank0"], report, indent=2)
    state.failures["rank0"] = {"host": "rank0", "play": "Engine", "task": "Wait | Ask each rank outside the play",
                               "msg": "rescued"}
    code, _out, _record = finished(tmp_path, state, 1, interrupts=1)
    with open(state.history_paths["rank0"]) as handle:
        assert code == run.EXIT_INTERRUPTED and json.load(handle)["status"] == "interrupted"


def test_runners_command_artifact_loses_its_environment_as_soon_as_the_playbook_runs(tmp_path):
    """A front end killed mid-run (SIGKILL) runs no end of its own: the operator's environment that ansible-runner
    wrote with the command (tests/integration/test_frontend.py proves the whole run) goes when it says running."""
    playbook_run = run.PlaybookRun({"subcommand": "stage"}, str(tmp_path / "runs"))
    os.makedirs(playbook_run.run_dir)
    path = os.path.join(playbook_run.run_dir, "command")
    with open(path, "w") as handle:
        json.dump({"command": ["ansible-playbook", "p.yml"], "cwd": "/repo", "env": {"HF_TOKEN": "t"}}, handle)
    os.chmod(path, 0o600)
    playbook_run._on_status({"status": "starting"})
    with open(path) as handle:
        assert "env" in json.load(handle)   # not written yet when runner says starting: nothing to do
    playbook_run._on_status({"status": "running"})
    with open(path) as handle:
        assert json.load(handle) == {"command": ["ansible-playbook", "p.yml"], "cwd": "/repo"}
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)


def test_status_prints_each_hosts_lines_once(tmp_path):
    state = RunState()
    state.status_lines = {"rank1": ["same line"], "rank0": ["same line", "receipts: none"]}
    state.lanes = {"rank0": {"lane": "l", "rank": 1}, "rank1": {"lane": "l", "rank": 0}}
    out = io.StringIO()
    spec = {"subcommand": "status", "playbook": "p", "tags": None, "inventory": "i", "limit": None,
            "extra_vars": [], "check": False, "verbose": 0, "cmdline": ""}
    playbook_run = run.PlaybookRun(spec, str(tmp_path / "runs"), out=out)
    os.makedirs(playbook_run.run_dir)
    playbook_run.state = state
    state.stats = {}
    assert playbook_run._finish(FakeRunner(0), run.Display(out)) == 0
    assert out.getvalue().splitlines()[:7] == ["DGX-STAGE STATUS: lane l, 2 hosts", "rank1 (rank 0):", "  same line",
                                               "rank0 (rank 1):", "  same line", "  receipts: none", "2/2 hosts read"]


# --- Ctrl-C ----------------------------------------------------------------------------------------------------

def test_the_first_interrupt_sends_sigint_to_ansible_playbooks_group_and_the_second_cancels(tmp_path):
    # A stand-in child in its own session (as ansible-runner's pexpect child is), named like ansible-playbook.
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, lambda *a: sys.exit(42))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code, "ansible-playbook"], stdout=subprocess.PIPE,
                             start_new_session=True)
    try:
        assert child.stdout.readline().strip() == b"ready"
        spec = {"subcommand": "stage"}
        playbook_run = run.PlaybookRun(spec, str(tmp_path))
        playbook_run._on_signal(signal.SIGINT, None)   # before its first event: forwarded once that names it
        assert playbook_run.forwarded_to is None and child.poll() is None
        assert "as soon as it runs" in playbook_run.events.get()["_note"]
        playbook_run.interrupts = 0
        playbook_run.state.handle({"event": "playbook_on_start", "pid": child.pid})
        playbook_run._on_signal(signal.SIGINT, None)
        assert child.wait(timeout=30) == 42
        assert playbook_run.forwarded_to == child.pid and playbook_run.interrupts == 1
        assert "SIGINT forwarded to ansible-playbook (pid %d)" % child.pid in playbook_run.events.get()["_note"]
        playbook_run._on_signal(signal.SIGTERM, None)
        assert playbook_run.interrupts == 2 and "cancelling" in playbook_run.events.get()["_note"]
    finally:
        if child.poll() is None:
            processes.kill_tree(child)


# --- report ----------------------------------------------------------------------------------------------------

def record_run(runs_dir, ident, subcommand, run_id, reports, started):
    os.makedirs(os.path.join(runs_dir, ident))
    runs.write_json(os.path.join(runs_dir, ident, "run.json"), {
        "ident": ident, "subcommand": subcommand, "run_id": run_id, "reports": reports, "started": started,
        "receipts_removed": {"localhost": ["/c/a"]} if run_id else {}})


@pytest.fixture
def recorded(tmp_path):
    """Two recorded runs: a stage run whose report is the ok fixture, then a status run (no reports)."""
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    shutil.copy(os.path.join(FIXTURES, "report-stage-ok.json"),
                str(report_dir / "localhost-20261201T101737Z-ed44.json"))
    runs_dir = str(tmp_path / "runs")
    record_run(runs_dir, "20261201T101736Z-stage-aaaa", "stage", "20261201T101737Z-ed44",
               {"localhost": str(report_dir / "localhost-20261201T101737Z-ed44.json")}, "2026-12-01T10:17:36Z")
    record_run(runs_dir, "20261201T102000Z-status-bbbb", "status", None, {}, "2026-12-01T10:20:00Z")
    return runs_dir, str(report_dir)


def test_report_renders_the_latest_run_with_reports_as_markdown(recorded, capsys):
    runs_dir, _report_dir = recorded
    code, out, _err = main(["report", "--markdown", "--runs-dir", runs_dir], capsys)
    assert code == 0
    assert out.splitlines()[0] == "### dgx-stage run 20261201T101737Z-ed44 (stage, 2026-12-01T10:17:36Z)"
    assert ("| localhost | 20261201T101737Z-ed44 | ok | 17/5 | 48.0 MiB | 0 | 0 | 160.6 | sample | 17/1 | 1 | - | - "
            "| - |") in out
    # By lane run id or runner ident, plain text when not a terminal.
    for wanted in ("20261201T101737Z-ed44", "20261201T101736Z-stage-aaaa"):
        code, out, _err = main(["report", wanted, "--runs-dir", runs_dir], capsys)
        assert code == 0 and "localhost  20261201T101737Z-ed44  ok " in out and "|" not in out


def test_report_shows_the_latest_run_even_one_that_reached_no_host_with_its_failures(recorded, capsys):
    """A stage against an unreachable host wrote no host report: report names that run and its failure, not
    the earlier ok run as if it were the latest."""
    runs_dir, _report_dir = recorded
    ident = "20261201T110000Z-stage-cccc"
    os.makedirs(os.path.join(runs_dir, ident))
    runs.write_json(os.path.join(runs_dir, ident, "run.json"), {
        "ident": ident, "subcommand": "stage", "run_id": None, "reports": {}, "started": "2026-12-01T11:00:00Z",
        "status": "failed", "failures": [{"host": "dgx2", "play": "Select the hosts of the lane", "task": "Gathering",
                                          "msg": "ssh: connect to host dgx2 port 22: No route to host",
                                          "unreachable": True}]})
    code, out, _err = main(["report", "--markdown", "--runs-dir", runs_dir], capsys)
    assert code == 0
    assert out.splitlines()[0] == ("### dgx-stage run %s (stage, 2026-12-01T11:00:00Z, failed): no host report "
                                   "was written" % ident), out
    assert "- host dgx2 unreachable in play Select the hosts of the lane, task Gathering: ssh: connect" in out
    assert "20261201T101737Z-ed44" not in out and "| HOST |" not in out


def test_report_names_a_host_that_failed_before_its_first_report_beside_the_hosts_reports(recorded, capsys):
    runs_dir, _report_dir = recorded
    record = os.path.join(runs_dir, "20261201T101736Z-stage-aaaa", "run.json")
    with open(record) as handle:
        data = json.load(handle)
    runs.write_json(record, dict(data, status="failed", failures=[
        {"host": "dgx2", "play": "Select the hosts of the lane", "task": "Gathering", "msg": "no route",
         "unreachable": True}]))
    code, out, _err = main(["report", "--runs-dir", runs_dir], capsys)
    assert "localhost  20261201T101737Z-ed44  ok " in out, out
    assert "host dgx2 unreachable in play Select the hosts of the lane, task Gathering: no route" in out.splitlines()
    code, out, _err = main(["report", "--runs-dir", runs_dir, "--limit", "localhost"], capsys)
    assert "dgx2" not in out, out


def test_an_interrupted_runs_reports_read_interrupted_in_the_files_and_in_report(recorded, capsys):
    runs_dir, report_dir = recorded
    history = os.path.join(report_dir, "localhost-20261201T101737Z-ed44.json")
    with open(history) as handle:
        report = json.load(handle)
    report["status"] = "running"
    for path in (history, os.path.join(report_dir, "localhost.json")):
        runs.write_json(path, report, indent=2)
    record = os.path.join(runs_dir, "20261201T101736Z-stage-aaaa", "run.json")
    with open(record) as handle:
        data = json.load(handle)
    runs.write_json(record, dict(data, status="interrupted"))
    # run.json says interrupted though the front end died before it settled the files: report says so too.
    code, out, _err = main(["report", "20261201T101737Z-ed44", "--runs-dir", runs_dir], capsys)
    assert code == 0 and "localhost  20261201T101737Z-ed44  interrupted" in out, out
    # The front end settles them at the end of an interrupted run: both files, this run's only, keeping their mode.
    for path in (history, os.path.join(report_dir, "localhost.json")):
        os.chmod(path, 0o644)
    assert list(runs.settle_unfinished({"localhost": history}, "20261201T101737Z-ed44", {})) == ["localhost"]
    for path in (history, os.path.join(report_dir, "localhost.json")):
        with open(path) as handle:
            assert json.load(handle)["status"] == "interrupted"
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
    assert runs.settle_unfinished({"localhost": history}, "20261201T101737Z-ed44", {}) == {}
    assert runs.settle_unfinished({"localhost": history}, "another-run", {}) == {}


def test_a_run_whose_front_end_was_killed_reads_interrupted_in_report(recorded, capsys):
    """SIGKILL leaves run.json and the host reports `running`; a dead front end pid says the run is over."""
    runs_dir, report_dir = recorded
    history = os.path.join(report_dir, "localhost-20261201T101737Z-ed44.json")
    with open(history) as handle:
        runs.write_json(history, dict(json.load(handle), status="running"), indent=2)
    dead = subprocess.Popen(["true"])
    dead.wait()
    record = os.path.join(runs_dir, "20261201T101736Z-stage-aaaa", "run.json")
    with open(record) as handle:
        data = json.load(handle)
    for pid, said in ((os.getpid(), "running"), (dead.pid, "interrupted")):
        runs.write_json(record, dict(data, status="running", pid=pid))
        code, out, _err = main(["report", "--runs-dir", runs_dir], capsys)
        assert code == 0 and "(stage, 2026-12-01T10:17:36Z, %s)" % said in out, out
        assert "localhost  20261201T101737Z-ed44  %s" % said in out, out


def test_report_on_a_runs_or_report_dir_it_cannot_list_exits_64_naming_it(tmp_path, monkeypatch, capsys):
    afile, locked = tmp_path / "afile", tmp_path / "locked"
    afile.write_text("")
    locked.mkdir()
    listdir = os.listdir

    def refusing(path):   # the tests may run as root, who lists any folder
        if str(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)
    monkeypatch.setattr(os, "listdir", refusing)
    for argv, said in (
            (["--runs-dir", str(afile)], "runs dir %s (Not a directory); pass another with --runs-dir DIR" % afile),
            (["--runs-dir", str(locked)], "runs dir %s (Permission denied); pass another with --runs-dir" % locked),
            (["--runs-dir", str(tmp_path / "none"), "--report-dir", str(afile)],
             "report dir %s (Not a directory); pass another with --report-dir DIR" % afile)):
        code, out, err = main(["report"] + argv, capsys)
        assert code == 64 and out == "" and err.startswith("dgx-stage: cannot read the %s" % said), err


def test_with_no_run_report_names_the_runs_dir_and_where_the_demos_recorded_theirs(tmp_path, monkeypatch, capsys):
    demo_runs = tmp_path / ".cache" / "demo" / "runs" / "20261201T100000Z-aaaa"
    demo_runs.mkdir(parents=True)
    (demo_runs / "run.json").write_text("{}")
    monkeypatch.setattr(cli, "REPO", str(tmp_path))
    monkeypatch.chdir(str(tmp_path))
    code, out, err = main(["report", "--runs-dir", str(tmp_path / "empty")], capsys)
    assert code == 64 and out == ""
    assert "no recorded run under %s; point at another runs dir with --runs-dir DIR or DGX_STAGE_RUNS_DIR " \
        "(runs are recorded under: .cache/demo/runs)" % (tmp_path / "empty") in err, err


def test_report_of_an_unknown_run_exits_64_listing_the_known_ones(recorded, capsys):
    runs_dir, _report_dir = recorded
    code, out, err = main(["report", "20990101T000000Z-0000", "--runs-dir", runs_dir], capsys)
    assert code == 64 and out == ""
    assert err.startswith("dgx-stage: unknown run 20990101T000000Z-0000; known runs: ")
    for known in ("20261201T101736Z-stage-aaaa", "20261201T101737Z-ed44", "20261201T102000Z-status-bbbb"):
        assert known in err
    code, _out, err = main(["report", "20261201T102000Z-status-bbbb", "--runs-dir", runs_dir], capsys)
    assert code == 64 and "wrote no host reports" in err


def test_report_limit_matching_no_host_exits_64(recorded, capsys):
    runs_dir, _report_dir = recorded
    code, _out, err = main(["report", "--limit", "rank*", "--runs-dir", runs_dir], capsys)
    assert code == 64 and "--limit rank* matches no host of run 20261201T101737Z-ed44 (hosts: localhost)" in err
    assert main(["report", "--limit", "local*", "--runs-dir", runs_dir], capsys)[0] == 0
    # The same pattern a playbook subcommand took: "!host" excluded everything matching nothing instead.
    hosts = ["dgx1", "dgx2", "dgx3"]
    assert cli._limit_hosts(hosts, "!dgx1") == ["dgx2", "dgx3"]
    assert cli._limit_hosts(hosts, "all:!dgx2") == ["dgx1", "dgx3"]
    assert cli._limit_hosts(hosts, "dgx*,!dgx3") == ["dgx1", "dgx2"]
    assert main(["report", "--limit", "!localhost", "--runs-dir", runs_dir], capsys)[0] == 64


def test_report_limit_from_a_missing_file_exits_64_naming_it(recorded, tmp_path, capsys):
    runs_dir, _report_dir = recorded
    code, out, err = main(["report", "--limit", "@%s" % (tmp_path / "retry"), "--runs-dir", runs_dir], capsys)
    assert code == 64 and out == "" and "--limit file not found: %s" % (tmp_path / "retry") in err, err


def test_report_reads_a_report_dir_without_any_recorded_run(recorded, tmp_path, capsys):
    _runs_dir, report_dir = recorded
    code, out, _err = main(["report", "--markdown", "--runs-dir", str(tmp_path / "none"), "--report-dir", report_dir],
                           capsys)
    assert code == 0 and "| localhost | 20261201T101737Z-ed44 | ok | 17/5 | 48.0 MiB |" in out
    code, _out, err = main(["report", "--runs-dir", str(tmp_path / "none")], capsys)
    assert code == 64 and "no recorded run under %s; point at another runs dir with --runs-dir DIR or " \
        "DGX_STAGE_RUNS_DIR" % (tmp_path / "none") in err, err


def write_lane_reports(report_dir, run_id="20261201T110000Z-4x00"):
    """A 4x lane's history reports: two waves of two hosts (stage_nas_readers 2), fan-out: rank 0 read the
    NAS alone for the shared files, the others took them from peers; rank 3 rejected one peer blob."""
    paths = {}
    for rank in range(4):
        with open(os.path.join(FIXTURES, "report-stage-ok.json")) as handle:
            report = json.load(handle)
        nas, peers = (48 << 20, 0) if rank == 0 else (8 << 20, 40 << 20)
        host = "dgx%d" % (rank + 1)
        report.update(host=host, rank=rank, world_size=4, run_id=run_id, started="2026-12-01T11:00:00Z",
                      bytes_from_nas=nas, bytes_from_peers=peers,
                      stage_started="2026-12-01T11:%02d:10Z" % (1 + 3 * (rank // 2)),
                      stage_finished="2026-12-01T11:%02d:40Z" % (3 + 3 * (rank // 2)))
        report["passes"]["stage"][0].update(bytes_from_nas=nas, bytes_from_peers=peers,
                                            peer_rejected=int(rank == 3))
        paths[host] = os.path.join(report_dir, "%s-%s.json" % (host, run_id))
        with open(paths[host], "w") as handle:
            json.dump(report, handle)
    return paths


LANE_BLOCK = ["Stage pass (UTC)",
              "HOST  STAGE WINDOW       FROM NAS  FROM PEERS  PEER REJECTED",
              "dgx1  11:01:10-11:03:40  48.0 MiB  0 B         0",
              "dgx2  11:01:10-11:03:40  8.0 MiB   40.0 MiB    0",
              "dgx3  11:04:10-11:06:40  8.0 MiB   40.0 MiB    0",
              "dgx4  11:04:10-11:06:40  8.0 MiB   40.0 MiB    1",
              "lane: 72.0 MiB from the NAS, 120.0 MiB from peers"]


def test_report_of_a_lane_shows_each_hosts_stage_window_and_bytes_by_source(recorded, capsys):
    runs_dir, report_dir = recorded
    paths = write_lane_reports(report_dir)
    record_run(runs_dir, "20261201T105959Z-stage-4x00", "stage", "20261201T110000Z-4x00", paths,
               "2026-12-01T10:59:59Z")
    code, out, _err = main(["report", "--runs-dir", runs_dir], capsys)
    lines = out.splitlines()
    assert code == 0 and lines[-len(LANE_BLOCK) - 1:] == [""] + LANE_BLOCK
    assert [line.split()[0] for line in lines[2:6]] == ["dgx1", "dgx2", "dgx3", "dgx4"]
    code, out, _err = main(["report", "--markdown", "--runs-dir", runs_dir], capsys)
    assert "| dgx3 | 11:04:10-11:06:40 | 8.0 MiB | 40.0 MiB | 0 |" in out.splitlines()
    # --limit to one host: no lane any more, and that host took no peer blob: its table alone.
    code, out, _err = main(["report", "--limit", "dgx1", "--runs-dir", runs_dir], capsys)
    assert code == 0 and len(out.splitlines()) == 6 and "Stage pass" not in out   # title, two bands of one row
    code, out, _err = main(["report", "--limit", "dgx4", "--runs-dir", runs_dir], capsys)
    assert out.splitlines()[-2:] == [LANE_BLOCK[1], LANE_BLOCK[5]]


def test_the_table_at_the_end_of_a_stage_run_has_the_stage_pass_block(tmp_path):
    state = RunState()
    for host, path in sorted(write_lane_reports(str(tmp_path)).items()):
        with open(path) as handle:
            state.reports[host] = json.load(handle)
        state.history_paths[host] = path
    state.stats = {"failures": {}, "dark": {}}
    code, out, _record = finished(tmp_path, state, 0)
    lines = out.splitlines()
    at = lines.index(LANE_BLOCK[0])
    assert code == 0 and lines[at:at + len(LANE_BLOCK)] == LANE_BLOCK and lines[at - 1] == ""
    assert lines[at - 2].startswith("dgx4  sample  17/1")   # the last band of the host table


def test_run_records_are_written_atomically_and_read_oldest_first(tmp_path):
    runs_dir = str(tmp_path)
    record_run(runs_dir, "b", "stage", "r2", {}, "2026-12-01T10:00:02Z")
    record_run(runs_dir, "a", "stage", "r1", {}, "2026-12-01T10:00:01Z")
    os.makedirs(os.path.join(runs_dir, "c"))
    with open(os.path.join(runs_dir, "c", "run.json"), "w") as handle:
        handle.write("{torn")
    assert [r["ident"] for r in runs.read_records(runs_dir)] == ["a", "b"]
    assert os.listdir(os.path.join(runs_dir, "a")) == ["run.json"]   # no temp file left
    assert [r["ident"] for r in runs.read_records(runs_dir) if "r2" in (r["ident"], r["run_id"])][-1] == "b"
    assert re.match(r"^\d{8}T\d{6}Z-[0-9a-f]{4}$", runs.new_ident())


def test_ansible_playbook_gets_sigint_when_the_front_end_is_killed(tmp_path, kill_at_teardown):
    # A SIGKILLed front end runs no handler: ansible-playbook (its own session) went on staging unwatched.
    # The guard ansible-runner starts instead asks the kernel for a SIGINT when its parent dies.
    fake = tmp_path / "fake-playbook"
    fake.write_text("#!%s\nimport signal, sys, time\n"
                    "def stop(signum, _frame):\n"
                    "    open(sys.argv[1], 'w').write(signal.Signals(signum).name)\n"
                    "    sys.exit(0)\n"
                    "signal.signal(signal.SIGINT, stop)\n"
                    "open(sys.argv[1] + '.started', 'w').close()\n"
                    "time.sleep(60)\n" % sys.executable)
    fake.chmod(0o755)
    said = tmp_path / "said"
    front_end = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys, time; sys.path.insert(0, %r)\n"
        "from dgx_stage import run\n"
        "guard = run.write_guard(%r, playbook=%r)\n"
        "subprocess.Popen([guard, %r], start_new_session=True)\n"
        "time.sleep(60)\n") % (cli.REPO, str(tmp_path / "bin"), str(fake), str(said))])
    try:
        deadline = time.time() + 30
        while not os.path.exists(str(said) + ".started") and time.time() < deadline:
            time.sleep(0.1)
        assert os.path.exists(str(said) + ".started")
        assert (tmp_path / "bin" / "ansible-playbook").exists()
    finally:
        kill_at_teardown(front_end)     # the stand-in playbook has its own session and must end by the guard
        front_end.kill()
        front_end.wait()
    deadline = time.time() + 10
    while not (said.exists() and said.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    assert said.read_text() == "SIGINT"
    assert run.runner_env(str(tmp_path / "bin"))["PATH"].startswith(str(tmp_path / "bin") + os.pathsep)


def test_report_survives_garbage_run_records_and_report_files(recorded, capsys):
    # run.json files a crash, an old version or a hand edit left: fields of the wrong type read as absent;
    # a half-written one is skipped; a report file that is not an object is named unreadable.
    runs_dir, report_dir = recorded
    for ident, text in (("20261201T090000Z-stage-cccc", '{"started": 5, "run_id": "r-1", "reports": "abc"}'),
                        ("20261201T090100Z-stage-dddd", '{"run_id": ["a"], "started": null}'),
                        ("20261201T090200Z-stage-eeee", '{"ident": "half", "run_'),
                        ("20261201T090300Z-stage-ffff", '[1, 2]')):
        os.makedirs(os.path.join(runs_dir, ident))
        with open(os.path.join(runs_dir, ident, "run.json"), "w") as handle:
            handle.write(text)
    code, out, _err = main(["report", "--runs-dir", runs_dir], capsys)
    assert code == 0 and "localhost  20261201T101737Z-ed44  ok" in out
    code, out, _err = main(["report", "r-1", "--runs-dir", runs_dir], capsys)
    # no "(None, None)" for what it lacks; its "reports" is no map of files, so it wrote none
    assert code == 0 and out.startswith("dgx-stage run r-1: no host report was written\n"), out
    with open(os.path.join(report_dir, "localhost-20261201T101737Z-ed44.json"), "w") as handle:
        handle.write("[]")
    code, out, _err = main(["report", "--runs-dir", runs_dir, "--markdown"], capsys)
    assert code == 0 and "not a JSON object" in out


def test_a_run_never_shares_another_runs_dir_and_an_unusable_runs_dir_exits_64(tmp_path, monkeypatch, capsys):
    # Two dgx-stage runs started in the same second could draw the same ident: the second wrote its run.json
    # and artifacts into the first one's dir.
    spec = {"subcommand": "stage"}
    idents = iter(["20261201T100000Z-aaaa", "20261201T100000Z-aaaa", "20261201T100000Z-bbbb"])
    monkeypatch.setattr(runs, "new_ident", lambda: next(idents))
    first, second = run.PlaybookRun(spec, str(tmp_path / "runs")), run.PlaybookRun(spec, str(tmp_path / "runs"))
    first._make_run_dir()
    second._make_run_dir()
    assert (first.ident, second.ident) == ("20261201T100000Z-aaaa", "20261201T100000Z-bbbb")
    assert second.run_dir == str(tmp_path / "runs" / second.ident) and os.path.isdir(second.run_dir)
    monkeypatch.undo()
    (tmp_path / "afile").write_text("")
    for runs_dir, why in (("afile", "is not a directory"), ("afile/runs", "Not a directory")):
        code, out, err = main(["status", "-i", "localhost,", "--runs-dir", str(tmp_path / runs_dir)], capsys)
        assert code == 64 and why in err and str(tmp_path / runs_dir) in err and "--runs-dir" in err, err


def test_a_failure_of_the_front_end_cancels_the_run_and_records_it(tmp_path, monkeypatch):
    # An exception in the run loop (a display error, a bug) left ansible-playbook running with nobody
    # watching and run.json saying "running" for ever.
    import threading
    import ansible_runner
    cancelled = threading.Event()

    def fake_run_async(**kwargs):
        def playbook():
            kwargs["event_handler"]({"event": "runner_retry", "event_data": {
                "host": "dgx1", "task_action": "mirror_job", "res": {"progress": {}, "line": "stage x: 1%"}}})
            deadline = time.time() + 30
            while not kwargs["cancel_callback"]() and time.time() < deadline:
                time.sleep(0.05)
            if kwargs["cancel_callback"]():
                cancelled.set()
        thread = threading.Thread(target=playbook, daemon=True)
        thread.start()
        return thread, FakeRunner(None, "running")

    def broken_progress(_self, _host, _entry):
        raise RuntimeError("display broke")

    monkeypatch.setattr(ansible_runner, "run_async", fake_run_async)
    monkeypatch.setattr(run.Display, "progress", broken_progress)
    spec = {"subcommand": "stage", "playbook": "stage-deepseek.yml", "tags": "stage",
            "inventory": "i", "limit": None, "extra_vars": [], "check": False, "verbose": 0}
    playbook_run = run.PlaybookRun(spec, str(tmp_path / "runs"), out=io.StringIO())
    with pytest.raises(RuntimeError):
        playbook_run.run()
    assert cancelled.is_set()
    with open(os.path.join(playbook_run.run_dir, "run.json")) as handle:
        record = json.load(handle)
    assert record["status"] == "error" and record["exit_code"] == 1 and "display broke" in record["error"]


def test_run_json_names_the_host_reports_as_soon_as_they_are_written(tmp_path, monkeypatch):
    """A front end killed (SIGKILL) before its end still leaves a run.json from which `report` finds them."""
    import threading
    import ansible_runner
    seen = {}
    reports = str(tmp_path / "reports")
    os.makedirs(reports)

    def fake_run_async(**kwargs):
        record = os.path.join(kwargs["private_data_dir"], "run.json")

        def playbook():
            # The lane facts name the report dir; the dgx_report callback writes the reports as a play ends.
            kwargs["event_handler"]({"event": "runner_on_ok", "event_data": {
                "host": "dgx1", "task_action": "set_fact", "res": {"ansible_facts": {"lane_report_dir": reports}}}})
            runs.write_json(os.path.join(reports, "dgx1-%s.json" % kwargs["ident"]),
                            {"host": "dgx1", "run_id": kwargs["ident"], "status": "running"})
            kwargs["event_handler"]({"event": "playbook_on_play_start", "event_data": {"play": "Stage"}})
            deadline = time.time() + 10
            while time.time() < deadline and not seen.get("reports"):
                with open(record) as handle:
                    seen.update(json.load(handle))
                time.sleep(0.05)
        thread = threading.Thread(target=playbook, daemon=True)
        thread.start()
        return thread, FakeRunner(0)

    monkeypatch.setattr(ansible_runner, "run_async", fake_run_async)
    spec = {"subcommand": "stage", "playbook": "stage-deepseek.yml", "tags": "stage", "inventory": "i",
            "limit": None, "extra_vars": [], "check": False, "verbose": 0, "cmdline": ""}
    playbook_run = run.PlaybookRun(spec, str(tmp_path / "runs"), out=io.StringIO())
    playbook_run.run()
    assert seen["status"] == "running" and seen["run_id"] == playbook_run.ident
    assert seen["reports"] == {"dgx1": os.path.join(reports, "dgx1-%s.json" % playbook_run.ident)}


def test_a_ctrl_c_before_the_run_exits_99_and_the_handlers_cover_the_whole_run(tmp_path, monkeypatch, capsys):
    # A Ctrl-C while the inventory was read, or ansible-runner loaded, was a KeyboardInterrupt traceback
    # (exit -2), after run.json was written "running" in the second case.
    def interrupted(_args, out=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "run_subcommand", interrupted)
    code, _out, err = main(["status"], capsys)
    assert code == 99 and err == "dgx-stage: interrupted before any playbook ran\n"
    playbook_run = run.PlaybookRun({"subcommand": "stage"}, str(tmp_path))
    seen = {}
    monkeypatch.setattr(playbook_run, "_run", lambda: seen.update(
        (s, signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)) or 0)
    before = signal.getsignal(signal.SIGINT)
    assert playbook_run.run() == 0
    assert seen == {signal.SIGINT: playbook_run._on_signal, signal.SIGTERM: playbook_run._on_signal}
    assert signal.getsignal(signal.SIGINT) is before
