#!/usr/bin/env python3
"""chdb_run.py JOB.json OUT.json — run a SQL script on chdb-core (a current
ClickHouse engine, in-process) and write what each query answered.

JOB.json: {"dir": "<session directory>", "steps": [{"name": "...",
"sql": "...", "query": true|false}, ...]}. Steps run in order in one chdb
session (one database, kept in "dir"). A step with "query": false is a
statement whose output is ignored; a failing statement stops the run. A
query step's answer is its TSVWithNamesAndTypes text; a failing query is
recorded and the run goes on.

OUT.json: {"version": "<server version>", "results": {"<name>":
{"out": "..."} | {"error": "..."}}, "failed_statement": null | {...}}.

Used by sql/compat_test.go, which runs the same steps on ClickHouse 18.16
and compares the answers. Run it with the venv that
`scripts/testenv/install.sh chdb` makes (FAULTLINE_CHDB_PYTHON).
"""

import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: chdb_run.py JOB.json OUT.json")
    os.environ.setdefault("TZ", "UTC")
    with open(sys.argv[1]) as f:
        job = json.load(f)
    from chdb import session  # imported late: a usage error needs no chdb

    sess = session.Session(job["dir"])
    out = {"version": "", "results": {}, "failed_statement": None}
    try:
        out["version"] = str(sess.query("SELECT version()", "TSV")).strip()
        for step in job["steps"]:
            sql = step["sql"]
            if step.get("query"):
                try:
                    res = sess.query(sql, "TSVWithNamesAndTypes")
                    out["results"][step["name"]] = {"out": res.bytes().decode("utf-8")}
                except Exception as e:  # noqa: BLE001 - recorded for the Go side
                    out["results"][step["name"]] = {"error": str(e)}
                continue
            try:
                sess.query(sql)
            except Exception as e:  # noqa: BLE001
                out["failed_statement"] = {"name": step["name"], "error": str(e)}
                break
    finally:
        sess.close()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
