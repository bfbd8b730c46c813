"""Test-bed fixtures (kafka, apiserver, postgres, s3, bigquery) come from hack/handoff_testbed."""
pytest_plugins = ["handoff_testbed.pytest_plugin"]
