"""Environment for the test run, set before Django reads its settings."""

import os
import tempfile

os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-secret-key-not-for-production")
os.environ.setdefault("VAR_DIR", tempfile.mkdtemp(prefix="registry-test-var-"))
# The test client and the browser tier speak plain http to the test server.
os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "false")
os.environ.setdefault("DJANGO_SECURE_COOKIES", "false")
