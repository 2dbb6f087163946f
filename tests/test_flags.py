"""Every family's command-line flags are generated from the fields of its profile table
(qual/flags.py): each field has its flag with its unit in the help, and the spellings users
typed before the flags were generated still set the same table values."""

from __future__ import annotations

import pytest

from qual import cli, settings
from qual.commands import family as command
from qual.family import Field
from qual.flags import UNITS, field_flags, flag_fields
from qual.workloads import registry


def _parser():
    return cli._parser(registry())


def _subparser(name: str):
    sub = next(a for a in _parser()._actions if a.dest == "command")
    return sub.choices[name]


def _settings(*argv: str) -> dict:
    args, extra = _parser().parse_known_args(list(argv))
    assert not extra, extra
    return command._settings(args.family, args, None)


RUNNABLE = [f for f in registry().values() if f.run is not None]


@pytest.mark.parametrize("family", RUNNABLE, ids=[f.name for f in RUNNABLE])
def test_every_field_has_its_flag_with_its_unit(family):
    p = _subparser(family.subcommand)
    by_flag = {s: a for a in p._actions for s in a.option_strings}
    for key, f in flag_fields(family.fields):
        action = by_flag.get(field_flags(key, f)[0])
        assert action is not None, f"{family.name}: no flag for {key}"
        assert action.dest == f"field:{key}"
        if f.kind in UNITS:
            assert UNITS[f.kind].replace("%", "%%") in action.help, (key, action.help)
    assert "usage:" in p.format_help()  # the help renders (a bare % in it would raise)


EXAMPLES = [(kind, example) for kind, text in UNITS.items() if ": " in text
            for example in text.split(": ", 1)[1].split(", ")]


@pytest.mark.parametrize("kind, example", EXAMPLES, ids=[f"{k}:{e}" for k, e in EXAMPLES])
def test_every_example_a_flags_help_gives_is_a_value_it_takes(kind, example):
    """What a flag's help shows as its kind's value (60 %, 500ms, 4K) is taken as given."""
    value = [example] if kind.endswith("s") else example
    assert settings.parse_value(Field("x", kind), value, "flags", "--x", []) is not None


@pytest.mark.parametrize("old, new", [
    (["checkpoint", "--count", "2"], ["checkpoint", "--per-pass", "2"]),
    (["checkpoint", "--restore"], ["checkpoint", "--restore", "yes"]),
    (["checkpoint", "--engine", "psync"], ["checkpoint", "--ioengine", "psync"]),
    (["checkpoint", "--write-only", "--baseline"],
     ["checkpoint", "--write-only", "yes", "--baseline", "yes"]),
    (["gnn", "--loader", "both"], ["gnn", "--loaders", "gids,mmap"]),
    (["gnn", "--loader", "mmap", "--fanouts", "10,5"], ["gnn", "--loaders", "mmap",
                                                        "--fanouts", "10,5"]),
    (["train", "--bs", "64k", "--iodepth", "4"],
     ["train", "--block-size", "64K", "--queue-depth", "4"]),
    (["train", "--page-cache", "--no-calibrate"],
     ["train", "--direct", "no", "--calibrate", "no"]),
    (["train", "--seed", "7", "--accelerators", "2"],
     ["train", "--shuffle-seed", "7", "--accelerators", "2"]),
])
def test_the_old_spellings_set_the_same_table(old, new):
    assert _settings(*old) == _settings(*new)


def test_flag_values_land_typed_in_the_table():
    got = _settings("train", "--page-cache", "--bs", "64k", "--accelerators", "2,4",
                    "--seed", "7")
    assert (got["direct"], got["block_size"], got["accelerators"], got["shuffle_seed"]) == \
        (False, 65536, [2, 4], 7)
    assert _settings("checkpoint", "--no-restore")["restore"] is False
    assert _settings("checkpoint", "--count", "3", "--retention", "1")["per_pass"] == 3


def test_keep_has_one_meaning():
    """--keep keeps what the run made; the checkpoints a pass keeps are --retention."""
    for family in RUNNABLE:
        p = _subparser(family.subcommand)
        keep = [a for a in p._actions if "--keep" in a.option_strings]
        if keep:
            assert keep[0].nargs == 0 and keep[0].dest == "keep", family.name
    with pytest.raises(SystemExit):  # a count after --keep is refused, not taken as retention
        _parser().parse_args(["checkpoint", "--keep", "3"])


def test_a_bad_flag_is_refused_naming_its_own_spelling(capsys):
    args, _ = _parser().parse_known_args(["checkpoint", "--count", "x", "--ioengine", "spdk"])
    assert command.run(args, registry()) == 2
    err = capsys.readouterr().err
    assert "--per-pass: " in err and "--ioengine: " in err, err


def test_write_only_and_read_only_exclude_each_other(tmp_path, capsys):
    args, _ = _parser().parse_known_args(["checkpoint", "--write-only", "--read-only",
                                          str(tmp_path)])
    assert command.run(args, registry()) == 2
    assert "--read-only: a run that only reads cannot also only write" in capsys.readouterr().err
