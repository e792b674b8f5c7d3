"""What `vulture` (make lint's dead-code check) cannot see being used: keep this list short.

Each entry names its user. Anything else vulture reports is dead code: delete it. Names the
standard library calls on a subclass (`readinto`, `do_GET`, ...) are `ignore_names` in
pyproject.toml's [tool.vulture].
"""

from builder.attest.provenance import ExternalParameters, ResourceDescriptor
from builder.base.profile import ArchFacts
from builder.cli import app, cache
from builder.cli.summary import Report
from builder.inspect.loads import scan_source
from builder.inspect.wheels import WheelInspection, WheelRecord
from builder.layers.extras import LayerRecord
from builder.layers.layer import LayerFacts, shadowed_files
from builder.oci.name import ImageRef
from builder.oci.v1 import DescriptorRecord, IndexDocument, ManifestDocument
from builder.oci.ztoc import Ztoc
from builder.reporter import QUIET
from builder.runtime import SERVER_ENTRY, SERVER_PACKAGE
from builder.sign.keys import PublicKey
from builder.verify.hardened.race import RaceLayout
from builder.verify.report import VerifyRecord

# Used by the tests only: small pieces they pin behaviour down through.
QUIET  # a reporter that says nothing (tests/orchestration/test_upgrade.py, tests/test_rebase_*.py)
ImageRef.familiar  # Docker's short form of a reference (tests/integration/test_imageref.py)
ImageRef.with_digest  # (tests/integration/test_imageref.py)
WheelInspection.is_pure  # (tests/plan/test_natives.py)
shadowed_files  # which files a later distribution overwrites (test_layers_by_distribution.py)
scan_source  # one file's loads, as the wheel scan sees them (tests/inspect/test_loads.py)
SERVER_ENTRY, SERVER_PACKAGE  # the server directory's layout (tests/runtime/test_package.py)
PublicKey.pem  # a key's public half as cosign writes it (tests/sign/test_keys.py)
Ztoc.build_tool  # the writer a ztoc names, read back (tests/oci/test_ztoc.py)

# Entry points: click registers a command by its decorator, never by name.
app.verify_command
app.base_command
cache.prune_command
cache.clean_command

# JSON field names a TypedDict declares: written and read as string keys, which vulture does
# not see as uses of the field.
ExternalParameters.platformVersion, ExternalParameters.baseImage  # provenance
ResourceDescriptor.uri  # provenance
WheelRecord.schema  # the inspection cache
ArchFacts.unpackaged, ArchFacts.python_packages, ArchFacts.python3_link  # the base's facts
LayerRecord.sde  # the extras-layers cache
LayerFacts.tar_size  # report.json
DescriptorRecord.mediaType, DescriptorRecord.artifactType  # OCI documents
ManifestDocument.schemaVersion, IndexDocument.schemaVersion
RaceLayout.writable  # the race's setup output
Report.bytecode_step  # report.json, read by the summary
VerifyRecord.deep_imports  # report.json's verification, `verify --json`
