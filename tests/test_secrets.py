"""No AWS keys in the repository: every file git tracks (or would track: untracked and not ignored)
is scanned for anything shaped like an access key id or a secret access key. Credentials come only
from the standard AWS chain (SSO, ~/.aws, the environment, instance roles); bots scan public
repositories for keys within minutes of a push, so this check runs before anything is committed."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Access key ids: a four-letter kind prefix (AKIA long-term, ASIA temporary, ...) and 16 more
# characters.
KEY_ID = re.compile(
    r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA|ASCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Z0-9])"
)
# Secret access keys: 40 base64 characters. Named as a secret, any such value counts; standing
# alone, only values with both cases, a digit and a '/' or '+' (hex digests and identifiers never
# have all four).
NAMED_SECRET = re.compile(
    r"(?i)(?:secret[_\- ]?(?:access[_\- "
    r"]?)?key|aws[_\-]?secret)[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)
BARE_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def secret_shaped(text: str) -> list[str]:
    "The key-shaped strings in `text`, each cut short so a report never repeats a whole key."
    hits = KEY_ID.findall(text) + NAMED_SECRET.findall(text)
    for m in BARE_SECRET.findall(text):
        if (
            re.search(r"[a-z]", m)
            and re.search(r"[A-Z]", m)
            and re.search(r"[0-9]", m)
            and re.search(r"[/+]", m)
        ):
            hits.append(m)
    return [h[:6] + "…" for h in hits]


def repo_files(root: Path = ROOT) -> list[Path]:
    "Every file git tracks, plus untracked files it does not ignore (about to be committed)."
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    return [root / p for p in sorted(set(out.decode().split("\0"))) if p]


def scan(root: Path = ROOT) -> dict[str, list[str]]:
    "file -> key-shaped strings found in it (text files; binaries and symlinks skipped)."
    found = {}
    for p in repo_files(root):
        if not p.is_file() or p.is_symlink() or p.stat().st_size > 20_000_000:
            continue
        data = p.read_bytes()
        if b"\0" in data[:8192]:
            continue
        hits = secret_shaped(data.decode("utf-8", "replace"))
        if hits:
            found[str(p.relative_to(root))] = hits
    return found


def test_the_scanner_catches_key_shapes():
    # built at run time, so this file holds no key-shaped string itself
    key_id = "AKIA" + "IOSFODNN7" + "EXAMPLE"
    secret = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
    assert secret_shaped(f"aws_access_key_id = {key_id}") == ["AKIAIO…"]
    assert secret_shaped(f"aws_secret_access_key={secret}")
    assert secret_shaped(f'{{"SecretAccessKey": "{secret}"}}')
    assert secret_shaped(f"creds: {secret}\n")
    assert secret_shaped("ASIA" + "Y34FZKBOKMUTVV7A")  # temporary keys too
    # and does not cry wolf at digests, ids and ordinary text
    for fine in (
        "sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709",
        "AWS_ACCESS_KEY_ID=testing",
        "arn:aws:iam::123456789012:role/qmind-render-job",
        "AKIAshort",
        "ami-03cf127a i-3cd25beecc7698276",
        "s3://qmind-lab/main/datasets/ds-v003/shard-00000.npz",
    ):
        assert secret_shaped(fine) == [], fine


def test_the_scan_covers_files_not_yet_committed_but_not_ignored_ones(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    (tmp_path / ".gitignore").write_text("local/\n")
    (tmp_path / "local").mkdir()
    # ignored: a local file
    (tmp_path / "local" / "credentials").write_text("AKIA" + "IOSFODNN7" + "EXAMPLE\n")
    # would be committed
    (tmp_path / "config.yaml").write_text("key: " + "AKIA" + "IOSFODNN7" + "EXAMPLE\n")
    assert scan(tmp_path) == {"config.yaml": ["AKIAIO…"]}


def test_no_file_in_the_repository_holds_an_aws_key():
    found = scan()
    assert not found, (
        f"AWS-key-shaped strings in {found}. Remove them (and rotate the key if it was "
        "real: IAM -> "
        "Security credentials -> deactivate); credentials belong in the AWS chain (SSO, "
        "~/.aws), never in git."
    )
