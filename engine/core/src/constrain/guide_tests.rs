//! The GPU's constrained step ([`Guide::sample_on`]: device argmax, mask uploaded, masked and
//! sampled where the logits lie) against the CPU's ([`Guide::sample`]) on SmolLM2's real
//! logits, with the device emulated on the host: the same tokens, step by step, for several
//! schemas and grammars, greedy, sampled and with a repetition penalty. The CUDA kernels that
//! do the masking and sampling are tested against the same host arithmetic on a GPU
//! (backend/cuda/exec/tests.rs: `masked_logits_match_the_host_mask`,
//! `device_sampler_matches_cpu_sampler`).

use std::sync::Arc;

use super::{Guide, OutputOnDevice};
use crate::constrain::Constraint;
use crate::model::Model;
use crate::sampling::{Sampler, SamplerConfig};
use crate::session::{Session, SessionConfig};

/// SmolLM2 (`$EDGE_RUN_MODEL`, default models/ at the repository root): `None` outside CI
/// where it is missing; in CI a missing model fails.
fn smollm2() -> Option<Arc<Model>> {
    let path = match std::env::var_os("EDGE_RUN_MODEL") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    if !path.exists() {
        let how = "run scripts/fetch-model.sh (the README's test command does)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{} is missing: {how}", path.display());
        }
        eprintln!("skipped: {} is missing: {how}", path.display());
        return None;
    }
    Some(Arc::new(Model::load(&path).expect("model")))
}

/// A GPU emulated on the host: the argmax and the masked sampling a CUDA backend computes
/// (`argmax_f32`, `mask_logits_f32`, `sample_top_k` in kernels.cu are the CPU's arithmetic),
/// and a count of what was asked. `decline`: answer `None` to the masked sampling, as a
/// backend that leaves it to the host.
struct EmulatedDevice<'a> {
    logits: &'a [f32],
    decline: bool,
    masked: std::cell::RefCell<Vec<f32>>,
    asked: std::cell::Cell<(u32, u32, u32)>,
}

impl OutputOnDevice for EmulatedDevice<'_> {
    fn argmax(&self) -> crate::error::Result<u32> {
        let (a, m, h) = self.asked.get();
        self.asked.set((a + 1, m, h));
        Ok(crate::sampling::argmax(self.logits))
    }

    fn sample_masked(
        &self,
        allowed: &[u32],
        sampler: &mut Sampler,
    ) -> crate::error::Result<Option<u32>> {
        if self.decline {
            return Ok(None);
        }
        let (a, m, h) = self.asked.get();
        self.asked.set((a, m + 1, h));
        let mut masked = self.masked.borrow_mut();
        masked.clear();
        masked.extend(self.logits.iter().enumerate().map(|(i, &x)| {
            let on = allowed
                .get(i / 32)
                .is_some_and(|w| (w >> (i % 32)) & 1 == 1);
            if on {
                x
            } else {
                f32::NEG_INFINITY
            }
        }));
        Ok(Some(sampler.sample(&masked)))
    }

    fn host(&self) -> crate::error::Result<&[f32]> {
        let (a, m, h) = self.asked.get();
        self.asked.set((a, m, h + 1));
        Ok(self.logits)
    }
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "468 SmolLM2 steps: minutes under qemu; the logic is the same on every target and x86-64 runs it"
)]
fn device_constrained_steps_pick_the_host_path_tokens() {
    let Some(model) = smollm2() else { return };
    let mut session = Session::new(
        model.clone(),
        &SessionConfig {
            ctx: Some(512),
            ..Default::default()
        },
    )
    .expect("session");
    let vocab = model.constraint_vocab().expect("vocabulary");
    let constraints = [
        Constraint::json_schema(
            r#"{"type": "object", "properties": {"action": {"enum": ["move", "turn", "stop"]},
               "distance": {"type": "number", "minimum": 0, "maximum": 10},
               "note": {"type": "string", "maxLength": 12}},
               "required": ["action", "distance"]}"#,
        ),
        Constraint::json_object(),
        Constraint::gbnf(r##"root ::= ("yes" | "no") ", because " [a-z ]{3,20} ".""##),
        Constraint::regex(r"[0-9]{1,3}(\.[0-9]{1,2})? meters"),
    ];
    let samplers = [
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            seed: 11,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            seed: 5,
            top_k: 0,
            temperature: 1.2,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            seed: 3,
            repeat_penalty: 1.3,
            ..SamplerConfig::default()
        },
    ];
    let prompt = model
        .tokenize(
            "A robot is told: move forward two meters. Its command:",
            true,
            false,
        )
        .expect("prompt");
    let n_vocab = model.params.n_vocab;
    let (mut steps, mut masked_on_device, mut argmax_taken) = (0, 0, 0);
    for (ci, c) in constraints.iter().enumerate() {
        for (si, cfg) in samplers.iter().enumerate() {
            for decline in [false, true] {
                let mut host = Guide::new(vocab, c).expect("constraint");
                let mut dev = Guide::new(vocab, c).expect("constraint");
                let mut host_s = Sampler::new(cfg.clone(), n_vocab);
                let mut dev_s = Sampler::new(cfg.clone(), n_vocab);
                session.reset();
                session.prefill(&prompt).expect("prefill");
                for step in 0..40 {
                    let logits = session.logits().to_vec();
                    let want = host.sample(&logits, &mut host_s).expect("host step");
                    let out = EmulatedDevice {
                        logits: &logits,
                        decline,
                        masked: Default::default(),
                        asked: Default::default(),
                    };
                    let got = dev.sample_on(&out, &mut dev_s).expect("device step");
                    assert_eq!(
                        got, want,
                        "constraint {ci}, sampler {si}, decline {decline}, step {step}"
                    );
                    let (argmaxes, masks, copies) = out.asked.get();
                    steps += 1;
                    masked_on_device += masks;
                    argmax_taken += u32::from(argmaxes > 0 && masks == 0 && copies == 0);
                    if !decline && si < 3 {
                        assert_eq!(copies, 0, "a step without a penalty copied the logits");
                    }
                    if host.is_eog(want) {
                        break;
                    }
                    for (g, s) in [(&mut host, &mut host_s), (&mut dev, &mut dev_s)] {
                        g.accept(
                            vocab,
                            want,
                            model.token_piece(want, true),
                            model.tokenizer.is_control(want),
                        )
                        .expect("accept");
                        s.accept(want);
                    }
                    session.step(want).expect("step");
                }
            }
        }
    }
    eprintln!(
        "{steps} steps identical; {masked_on_device} sampled under an uploaded mask, \
         {argmax_taken} taken from the device argmax"
    );
    assert!(masked_on_device > 50 && argmax_taken > 20);
}
