"""What the minio/mc service does, against the stand-in S3 server: the buckets."""

import os
import sys
from pathlib import Path

import boto3

s3 = boto3.client(
    "s3",
    endpoint_url=os.environ.get("S3_ENDPOINT", "http://minio:9000"),
    aws_access_key_id="registry",
    aws_secret_access_key=Path("/run/secrets/s3_secret_key").read_text().strip(),
    region_name="us-east-1",
)
existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
for bucket in sys.argv[1:]:
    if bucket not in existing:
        s3.create_bucket(Bucket=bucket)
    print("bucket", bucket)
