//! NVRTC (from the nvidia-cuda-nvrtc-cu12 wheel) compiles the generated plan header, which
//! has no system headers to lean on, into device code for sm_80 and sm_90.

mod support;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

/// Whether libnvrtc can be loaded here (scripts/test.sh puts the wheel's on the search path).
fn nvrtc_available() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the library.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs scripts/test.sh, which puts the wheel's libnvrtc on LD_LIBRARY_PATH"
        );
        eprintln!("libnvrtc not found: skipped (scripts/test.sh provides it)");
    }
    present
}

#[test]
fn the_plan_header_compiles_with_nvrtc() {
    if !nvrtc_available() {
        return;
    }
    let header = std::fs::read_to_string(support::root().join("cuda/stragglar_plan.h")).unwrap();
    let source = format!(
        "{header}\n\
         extern \"C\" __global__ void ncclStragglarPlanProbe(const RawPlanHeader* plan, uint32_t* out) {{\n\
           const RawStep* steps = (const RawStep*)((const char*)plan + plan->steps_at);\n\
           out[0] = plan->step_count > 0 ? steps[0].kind : STEP_COPY_IN;\n\
           out[1] = (uint32_t)(plan->count & 0xffffffffu);\n\
           out[2] = steps[0].turn == NO_TURN;\n\
         }}\n"
    );
    for arch in ["sm_80", "sm_90"] {
        let ptx = compile_ptx_with_opts(
            &source,
            CompileOptions {
                arch: Some(arch),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{arch}: {e:?}"));
        let text = ptx.to_src();
        assert!(text.contains("ncclStragglarPlanProbe"), "{arch}");
        assert!(text.contains(&format!(".target {arch}")), "{arch}");
    }
}
