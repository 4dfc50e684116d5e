"""Reads a JUnit XML file with junitparser (the parser many CI tools and Python test
reporters use) and prints what it understood as JSON, so a Rust test can check that a real
consumer sees the suites, testcases, results and properties bench meant to write.

Usage: python tests/junit_check.py path/to/junit.xml
Exits 1 (with a message on stderr) when the file does not parse or its suite counters
disagree with its testcases.
"""
import json
import sys

from junitparser import Error, Failure, JUnitXml, Properties, Skipped, TestSuite


def case_result(case):
    for r in case.result:
        kind = {Failure: "failure", Error: "error", Skipped: "skipped"}.get(type(r))
        if kind:
            return kind, r.type, r.message
    return "passed", None, None


def properties_of(element):
    out = {}
    for props in element.iterchildren(Properties):
        for p in props:
            out[p.name] = p.value
    return out


def main(path):
    xml = JUnitXml.fromfile(path)
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    report = []
    for suite in suites:
        cases = []
        for case in suite:
            result, type_, message = case_result(case)
            cases.append({
                "name": case.name,
                "classname": case.classname,
                "time": case.time,
                "result": result,
                "type": type_,
                "message": message,
                "properties": properties_of(case),
            })
        counted = {k: sum(c["result"] == k for c in cases) for k in ("failure", "error")}
        problems = []
        if suite.tests != len(cases):
            problems.append(f"tests={suite.tests} but {len(cases)} testcases")
        if suite.failures != counted["failure"]:
            problems.append(f"failures={suite.failures} but {counted['failure']} failures")
        if suite.errors != counted["error"]:
            problems.append(f"errors={suite.errors} but {counted['error']} errors")
        if problems:
            sys.exit(f"{path}: suite {suite.name}: " + "; ".join(problems))
        report.append({
            "name": suite.name,
            "hostname": suite.hostname,
            "timestamp": suite.timestamp,
            "tests": suite.tests,
            "failures": suite.failures,
            "errors": suite.errors,
            "properties": {p.name: p.value for p in suite.properties()},
            "cases": cases,
        })
    json.dump({"suites": report}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: junit_check.py JUNIT_XML")
    main(sys.argv[1])
