//! Manifest signing and verification throughput on one core.
//!
//! `cargo bench --bench manifest_signing`. Criterion runs everything on the calling
//! thread; each figure is for one manifest of typical size (two exposed paths, a
//! three-argument command, an environment variable, a 256-byte state snapshot).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use hatchery::manifest::{
    CpuLimit, ExposedPath, FilesystemScope, Lineage, Manifest, MemoryMb, NetworkPolicy, PidsLimit,
    ProfileName, ResourceSpec, SpawnRequest, StateSnapshot, TimeoutMs, Validity, WorkerId,
    canonical,
};
use hatchery::signing::{Keyring, ManifestSigner};

const NOW: u64 = 1_700_000_000;
/// Manifests verified by one signer before a fresh one (empty nonce memory) takes over.
const BATCH: usize = 4096;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn typical_request() -> BenchResult<SpawnRequest> {
    Ok(SpawnRequest {
        resources: ResourceSpec {
            cpu_limit: CpuLimit::new(0.5)?,
            memory_limit_mb: MemoryMb::new(256)?,
            pids_limit: PidsLimit::new(64)?,
            timeout_ms: TimeoutMs::new(300_000)?,
            network_policy: NetworkPolicy::default(),
            max_output_bytes: None,
        },
        filesystem: FilesystemScope {
            read_only: vec![ExposedPath::new("/srv/datasets/corpus")?],
            read_write: vec![ExposedPath::new("/srv/workers/w-0001/work")?],
            allow_exec: None,
        },
        profile: ProfileName::new("default")?,
        command: vec!["python3".into(), "agent.py".into(), "--replica".into()],
        env: vec!["HATCHERY_ROLE=replica".into()],
        cwd: Some("/srv/workers/w-0001/work".into()),
        state_snapshot: StateSnapshot::new("s".repeat(256))?,
    })
}

fn issue_many(signer: &ManifestSigner, n: usize) -> BenchResult<Vec<Manifest>> {
    let validity = Validity::starting_at(NOW, 3600)?;
    (0..n)
        .map(|i| {
            let lineage = Lineage::root(WorkerId::new(format!("w-{i:06}"))?);
            Ok(signer.issue(lineage, typical_request()?, validity)?)
        })
        .collect()
}

fn setup() -> BenchResult<(Keyring, Vec<Manifest>)> {
    let keyring = Keyring::generate()?;
    let signer = ManifestSigner::new(keyring.clone());
    let manifests = issue_many(&signer, BATCH)?;
    Ok((keyring, manifests))
}

fn benches(c: &mut Criterion) {
    let (keyring, manifests) = match setup() {
        Ok(s) => s,
        Err(e) => panic!("benchmark setup: {e}"),
    };
    let signer = ManifestSigner::new(keyring.clone());
    let mut group = c.benchmark_group("manifest");
    group.throughput(Throughput::Elements(1));

    let mut m = manifests[0].clone();
    group.bench_function("sign", |b| b.iter(|| signer.sign(black_box(&mut m))));

    group.bench_function("canonical_encode", |b| {
        b.iter(|| canonical::encode(black_box(&manifests[0])))
    });

    group.bench_function("check_signature", |b| {
        b.iter(|| signer.check_signature(black_box(&manifests[0])))
    });

    // Every check, nonce memory included: each iteration verifies a different manifest
    // (a repeated one would be a replay); a fresh verifier every BATCH manifests, outside
    // the timed part.
    group.bench_function("verify", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let n = left.min(BATCH);
                let mut verifier = ManifestSigner::new(keyring.clone());
                let start = Instant::now();
                for m in &manifests[..n] {
                    let _ = black_box(verifier.verify(black_box(m), NOW));
                }
                timed += start.elapsed();
                left -= n;
            }
            timed
        })
    });

    // The same, handing the manifest over (no copy), as `verify_json` does.
    group.bench_function("verify_owned", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let n = left.min(BATCH);
                let mut verifier = ManifestSigner::new(keyring.clone());
                let batch: Vec<Manifest> = manifests[..n].to_vec();
                let start = Instant::now();
                for m in batch {
                    let _ = black_box(verifier.verify_owned(black_box(m), NOW));
                }
                timed += start.elapsed();
                left -= n;
            }
            timed
        })
    });

    let jsons: Vec<Vec<u8>> = manifests
        .iter()
        .filter_map(|m| m.to_json().ok())
        .map(String::into_bytes)
        .collect();
    group.bench_function("decode_json_and_verify", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                let n = left.min(jsons.len());
                let mut verifier = ManifestSigner::new(keyring.clone());
                let start = Instant::now();
                for j in &jsons[..n] {
                    let _ = black_box(verifier.verify_json(black_box(j), NOW));
                }
                timed += start.elapsed();
                left -= n;
            }
            timed
        })
    });
    group.finish();
}

criterion_group! {
    name = signing;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(signing);
