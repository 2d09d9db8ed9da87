"""core.surface, the checks every wing's inventory of framework names runs, on the standard library as the
framework: a name found or named missing, a call checked against the signature, an instance attribute
found in the method that sets it, a probe's verdict, and the source scan for private names."""

import json

from verl_avspo.core.surface import Touch, framework_names, private_names_used, resolve, surface_problem


def test_a_name_resolves_or_is_named_missing():
    assert resolve("json:JSONDecoder.decode") is json.JSONDecoder.decode
    assert surface_problem(Touch("json:JSONDecoder.no_such", "here", "why")) == "json.JSONDecoder.no_such is missing"
    assert "does not import" in surface_problem(Touch("no_such_module_here:x", "here", "why"))


def test_the_call_is_checked_against_the_signature():
    assert surface_problem(Touch("json:JSONDecoder.raw_decode", "here", "why", call=(2, ("idx",)))) is None
    problem = surface_problem(Touch("json:JSONDecoder.raw_decode", "here", "why", call=(4, ())))
    assert problem.startswith("json:JSONDecoder.raw_decode(self, s, idx=0) does not take 4 positional arguments")


def test_an_instance_attribute_is_found_in_its_setter():
    assert surface_problem(Touch("json:JSONDecoder.parse_float", "here", "why", set_by="__init__")) is None
    problem = surface_problem(Touch("json:JSONDecoder.no_such", "here", "why", set_by="__init__"))
    assert problem == "json.JSONDecoder.__init__ no longer sets or reads .no_such"


def test_a_probe_decides_a_format():
    assert surface_problem(Touch("json:dumps", "here", "why", probe=lambda: None)) is None
    assert surface_problem(Touch("json:dumps", "here", "why", probe=lambda: "changed")) == "changed"


def test_private_names_are_found_as_attributes_and_getattr_strings(tmp_path):
    source = tmp_path / "wing.py"
    source.write_text("a = obj._scanner\nb = getattr(obj, '_private')\nc = obj.__dict__\nd = 'not a name'\n")
    assert private_names_used([source]) == {"_scanner": ["wing.py:1"], "_private": ["wing.py:2"]}
    assert "parse_float" in framework_names([json.JSONDecoder]) and "scan_once" in framework_names([json.JSONDecoder])
