"""What every section of the job file shares: the strict base model, the number types and the
name rules (config/job.py, config/infra.py). No I/O, no trainmaster imports."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]

# Job names become Kubernetes object names and pod names (job-name + "-worker-N-0" ...),
# so they follow DNS-1123 labels and leave room for suffixes.
JOB_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
# The Kubernetes backend names the job's Service after it (Volcano's svc plugin), and a Service
# name is a DNS-1035 label: it starts with a letter (k8s.io/apimachinery/pkg/util/validation
# IsDNS1035Label; naming.is_dns1035_label). Checked in the job file, so `config validate` refuses
# what the backend would.
JOB_NAME_RULE = (
    "is not a DNS-1035 label (the Kubernetes Service of the job takes its name): use lower-case "
    "letters, digits and '-', start with a letter, end with a letter or digit, at most 40 characters"
)
# `data stage`'s service account for S3 reads (IRSA), made by `cluster plan` for the buckets in
# cluster.data_buckets (cluster/eksctl.py s3_irsa_config).
S3_READER = "trainmaster-s3-reader"
# S3 bucket naming rules (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html)
S3_BUCKET = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
CACHESET = r"^[A-Za-z0-9_-]+$"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)
