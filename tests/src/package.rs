//! The deployable zip as Lambda's `provided.al2023` runtime takes it: one
//! executable `bootstrap` at the zip's root, an x86-64 ELF that needs no
//! newer glibc than Amazon Linux 2023's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

/// Amazon Linux 2023's glibc, the newest a `provided.al2023` bootstrap may need.
pub const AL2023_GLIBC: (u32, u32) = (2, 34);

/// Where `make package` writes the deployable zip.
pub fn zip_path() -> PathBuf {
    crate::repo_root().join("target/lambda/node-fencer/bootstrap.zip")
}

/// The deployable zip, once written whole: `make test` builds it last
/// beside the integration tests (its `[checks]` lines), then marks it
/// built (`bootstrap.zip.built`, as the zip itself is written in place);
/// it removes both of an earlier run first, so that no test runs a stale
/// zip. Outside `make test`, the zip `make package` wrote.
pub fn built_zip() -> anyhow::Result<PathBuf> {
    let zip = zip_path();
    if std::env::var_os(crate::late_build::PID_VAR).is_none() {
        if !zip.is_file() {
            bail!(
                "{} does not exist: build it with `make package`",
                zip.display()
            );
        }
        return Ok(zip);
    }
    let built = zip.with_extension("zip.built");
    crate::late_build::wait_for(std::slice::from_ref(&built), "the deployable zip")?;
    Ok(zip)
}

/// Extracts `bootstrap` from the deployable zip at `zip` into `dir`; its path.
pub fn extract_bootstrap(zip: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    if !zip.is_file() {
        bail!(
            "{} does not exist: build it with `make package` (or pass --binary)",
            zip.display()
        );
    }
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(zip)
        .arg(dir)
        .status()
        .context("running python3 to unzip the bootstrap")?;
    if !status.success() {
        bail!("could not extract {}", zip.display());
    }
    let binary = dir.join("bootstrap");
    // zipfile does not restore the mode bits.
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755))?;
    Ok(binary)
}

/// What [`check_zip`] found, one line each.
pub type Facts = Vec<String>;

/// Checks the zip at `zip` and the `bootstrap` extracted from it at
/// `bootstrap`; an error names what is wrong.
pub fn check_zip(zip: &Path, bootstrap: &Path) -> anyhow::Result<Facts> {
    let listing = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             for i in zipfile.ZipFile(sys.argv[1]).infolist():\n\
             \x20   print(oct(i.external_attr >> 16), i.filename)",
        )
        .arg(zip)
        .output()
        .context("running python3 to list the zip")?;
    ensure!(
        listing.status.success(),
        "could not list {}: {}",
        zip.display(),
        String::from_utf8_lossy(&listing.stderr)
    );
    let text = String::from_utf8(listing.stdout)?;
    let entries: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    let [(mode, name)] = entries.as_slice() else {
        bail!("the zip holds {entries:?}, not one bootstrap");
    };
    ensure!(
        *name == "bootstrap",
        "the zip's one entry is {name}, not bootstrap at its root"
    );
    let mode = u32::from_str_radix(mode.trim_start_matches("0o"), 8)
        .with_context(|| format!("the zip records mode {mode}"))?;
    ensure!(
        mode & 0o170_000 == 0o100_000 && mode & 0o111 == 0o111,
        "bootstrap is recorded with mode {mode:o}, not an executable regular file"
    );
    let binary = std::fs::read(bootstrap)?;
    ensure!(
        binary.starts_with(b"\x7fELF"),
        "bootstrap is not an ELF file"
    );
    // ELFCLASS64, little-endian, e_machine EM_X86_64 (62).
    ensure!(
        binary.get(4) == Some(&2)
            && binary.get(5) == Some(&1)
            && binary.get(18..20) == Some(&[62, 0]),
        "bootstrap is not a 64-bit x86-64 ELF"
    );
    let glibc = newest_glibc(&binary);
    if let Some(v) = glibc {
        ensure!(
            v <= AL2023_GLIBC,
            "bootstrap needs glibc {}.{}, newer than Amazon Linux 2023's {}.{}",
            v.0,
            v.1,
            AL2023_GLIBC.0,
            AL2023_GLIBC.1
        );
    }
    Ok(vec![
        format!("the zip holds one entry, bootstrap, mode {mode:o}"),
        "bootstrap: ELF 64-bit x86-64".to_owned(),
        match glibc {
            Some((major, minor)) => format!(
                "bootstrap needs glibc {major}.{minor} at most (Amazon Linux 2023 has {}.{})",
                AL2023_GLIBC.0, AL2023_GLIBC.1
            ),
            None => "bootstrap names no glibc version (static)".to_owned(),
        },
    ])
}

/// The newest `GLIBC_X.Y` version the binary's symbol versions name.
fn newest_glibc(binary: &[u8]) -> Option<(u32, u32)> {
    const TAG: &[u8] = b"GLIBC_";
    binary
        .windows(TAG.len())
        .enumerate()
        .filter(|(_, w)| *w == TAG)
        .filter_map(|(i, _)| {
            let rest = &binary[i + TAG.len()..];
            let end = rest
                .iter()
                .position(|b| !(b.is_ascii_digit() || *b == b'.'))
                .unwrap_or(rest.len());
            let text = std::str::from_utf8(&rest[..end]).ok()?;
            let mut parts = text.split('.');
            Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
        })
        .max()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::{check_zip, newest_glibc};

    #[test]
    fn the_newest_glibc_version_named_is_found() {
        let binary = b"\0GLIBC_2.2.5\0GLIBC_2.17\0GLIBC_2.3.4\0GLIBC_PRIVATE\0";
        assert_eq!(newest_glibc(binary), Some((2, 17)));
        assert_eq!(newest_glibc(b"no versions"), None);
    }

    /// The first bytes of an ELF file for `machine` (62 is x86-64, 183
    /// aarch64), then `tail`.
    fn elf(machine: u8, tail: &[u8]) -> Vec<u8> {
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        header[18] = machine;
        header.extend_from_slice(tail);
        header
    }

    /// A zip in a directory of its own holding `entries` (name, Unix mode),
    /// each with `binary`'s bytes, written by Python's zipfile as cargo
    /// lambda's is read; and the file `bootstrap` beside it.
    fn zip(test: &str, entries: &[(&str, u32)], binary: &[u8]) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("nf-zip-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let bootstrap = dir.join("bootstrap");
        std::fs::write(&bootstrap, binary).expect("writing bootstrap");
        let zip = dir.join("bootstrap.zip");
        let mut command = Command::new("python3");
        command.arg("-c").arg(
            "import sys, zipfile\n\
             z = zipfile.ZipFile(sys.argv[1], 'w')\n\
             data = open(sys.argv[2], 'rb').read()\n\
             for name, mode in zip(sys.argv[3::2], sys.argv[4::2]):\n\
             \x20   info = zipfile.ZipInfo(name)\n\
             \x20   info.external_attr = int(mode, 8) << 16\n\
             \x20   z.writestr(info, data)\n\
             z.close()",
        );
        command.arg(&zip).arg(&bootstrap);
        for (name, mode) in entries {
            command.arg(name).arg(format!("{mode:o}"));
        }
        let status = command.status().expect("python3 writes the zip");
        assert!(status.success(), "writing {}", zip.display());
        (zip, bootstrap)
    }

    fn problem(test: &str, entries: &[(&str, u32)], binary: &[u8]) -> String {
        let (zip, bootstrap) = zip(test, entries, binary);
        let found = check_zip(&zip, &bootstrap);
        let _ = std::fs::remove_dir_all(zip.parent().unwrap_or(Path::new("/nonexistent")));
        match found {
            Ok(facts) => panic!("{test}: accepted: {facts:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_zip_as_provided_al2023_takes_it_is_accepted() {
        let (zip, bootstrap) = zip(
            "good",
            &[("bootstrap", 0o100_755)],
            &elf(62, b"\0GLIBC_2.28\0GLIBC_2.34\0"),
        );
        let facts = check_zip(&zip, &bootstrap).expect("a good zip");
        let _ = std::fs::remove_dir_all(zip.parent().unwrap_or(Path::new("/nonexistent")));
        assert!(facts[2].contains("glibc 2.34 at most"), "{facts:?}");
    }

    /// A zip's entries (name, Unix mode), its bootstrap's bytes, and what
    /// the error must say.
    type Case<'a> = (&'a str, &'a [(&'a str, u32)], Vec<u8>, &'a str);

    #[test]
    fn each_way_a_zip_fails_provided_al2023_is_named() {
        let x86 = elf(62, b"\0GLIBC_2.17\0");
        let cases: [Case; 6] = [
            (
                "folder",
                &[("target/bootstrap", 0o100_755)],
                x86.clone(),
                "not bootstrap at its root",
            ),
            (
                "mode",
                &[("bootstrap", 0o100_644)],
                x86.clone(),
                "not an executable",
            ),
            (
                "two",
                &[("bootstrap", 0o100_755), ("README", 0o100_644)],
                x86.clone(),
                "not one bootstrap",
            ),
            (
                "script",
                &[("bootstrap", 0o100_755)],
                b"#!/bin/sh\n".to_vec(),
                "not an ELF file",
            ),
            (
                "arm",
                &[("bootstrap", 0o100_755)],
                elf(183, b""),
                "not a 64-bit x86-64 ELF",
            ),
            (
                "glibc",
                &[("bootstrap", 0o100_755)],
                elf(62, b"\0GLIBC_2.38\0"),
                "glibc 2.38, newer",
            ),
        ];
        for (test, entries, binary, expected) in cases {
            let message = problem(test, entries, &binary);
            assert!(message.contains(expected), "{test}: {message}");
        }
    }
}
