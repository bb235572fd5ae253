//! NVRTC (from the nvidia-cuda-nvrtc-cu12 wheel) compiles the generated plan header, which
//! has no system headers to lean on, into device code for sm_80 and sm_90.

mod support;

use std::path::Path;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

/// Whether libnvrtc can be loaded here (scripts/test.sh puts the wheel's on the search path).
fn nvrtc_available() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the library.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        assert!(
            std::env::var_os("CI").is_none()
                && std::env::var_os("STRAGGLAR_TEST_REQUIRE_NVRTC").is_none(),
            "scripts/test.sh puts the wheel's libnvrtc on LD_LIBRARY_PATH: it must load"
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
           out[1] = plan->chunk_count + plan->slot_count;\n\
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

#[test]
fn stragglar_kernels_writes_a_valid_cubin_per_architecture() {
    if !nvrtc_available() {
        return;
    }
    // The one build of the run (`stragglar kernels --arch sm_75,sm_80,sm_90 --cache
    // --resources --out`): with --cache, each CUBIN is also the kernel cache's entry, so a
    // GPU's first use skips NVRTC.
    let built = support::real_kernels(Path::new(env!("CARGO_BIN_EXE_stragglar")))
        .unwrap_or_else(|e| panic!("{e}"));
    let (out, cache, stdout) = (&built.out, &built.cache, &built.report);
    for arch in ["sm_80", "sm_90"] {
        let cubin = std::fs::read(out.join(format!("stragglar_{arch}.cubin"))).unwrap();
        let module = stragglar::gpu::kernels::MODULE_KERNELS;
        stragglar::gpu::cubin::check(&cubin, arch, &module)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let other = if arch == "sm_80" { "sm_90" } else { "sm_80" };
        assert!(stragglar::gpu::cubin::check(&cubin, other, &module).is_err());
        use stragglar::gpu::kernels::{
            ALL_REDUCE_KERNEL, APPLY_PROBE_KERNEL, DELAY_KERNEL, TICKET_KERNEL,
        };
        for kernel in [
            ALL_REDUCE_KERNEL,
            TICKET_KERNEL,
            APPLY_PROBE_KERNEL,
            DELAY_KERNEL,
        ] {
            let name = kernel.as_bytes();
            assert!(
                cubin.windows(name.len()).any(|w| w == name),
                "{arch}: no {kernel} in the CUBIN"
            );
        }
        assert!(stdout.contains(arch), "{stdout}");
        the_static_targets_hold(arch, stdout, &out.join(format!("stragglar_{arch}.cubin")));
        let (cached, origin) = stragglar::gpu::nvrtc::cubin_cached(arch, Some(cache)).unwrap();
        assert_eq!(origin, stragglar::gpu::nvrtc::Origin::Cache, "{arch}");
        assert_eq!(cached, cubin, "{arch}");
        let turn_path = out.join(format!("stragglar_turn_{arch}.cubin"));
        let turn = std::fs::read(&turn_path).unwrap();
        stragglar::gpu::cubin::check(&turn, arch, &stragglar::gpu::kernels::TURN_MODULE_KERNELS)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let (cached, origin) = stragglar::gpu::nvrtc::Unit::turn()
            .cubin_cached(arch, Some(cache))
            .unwrap();
        assert_eq!(origin, stragglar::gpu::nvrtc::Origin::Cache, "{arch}");
        assert_eq!(cached, turn, "{arch}");
        the_turn_module_calls_only_cudagraphsetconditional(arch, &turn_path);
    }
    // Before sm_80 there is no hardware bf16 narrowing: the kernels still build (software).
    let cubin = std::fs::read(out.join("stragglar_sm_75.cubin")).unwrap();
    stragglar::gpu::cubin::check(&cubin, "sm_75", &stragglar::gpu::kernels::MODULE_KERNELS)
        .unwrap_or_else(|e| panic!("sm_75: {e}"));
}

/// nvdisasm, from the venv's triton wheel (PyTorch's dependency) or `STRAGGLAR_TEST_NVDISASM`.
fn nvdisasm() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("STRAGGLAR_TEST_NVDISASM") {
        return Some(path.into());
    }
    let found = std::process::Command::new("find")
        .arg(support::root().join(".venv"))
        .args(["-name", "nvdisasm", "-type", "f"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&found.stdout);
    text.lines().next().map(std::path::PathBuf::from)
}

/// The SASS of `cubin` (nvdisasm's text); `None` where nvdisasm is missing, which only a run
/// outside scripts/test.sh may be.
fn sass_of(cubin: &std::path::Path) -> Option<String> {
    let Some(tool) = nvdisasm() else {
        assert!(
            std::env::var_os("STRAGGLAR_TEST_REQUIRE_NVRTC").is_none(),
            "scripts/test.sh installs PyTorch, whose triton wheel has nvdisasm"
        );
        eprintln!("nvdisasm not found: the SASS figures are skipped");
        return None;
    };
    let sass = std::process::Command::new(&tool)
        .arg(cubin)
        .output()
        .unwrap();
    Some(String::from_utf8_lossy(&sass.stdout).into_owned())
}

/// The figures docs/KERNELS.md promises, from ptxas's report (`--resources`) and the SASS:
/// no function of the kernel spills (no spill stores or loads: the kernel, its control code and
/// the outlined data loops), at most 40 system-scope fences in the whole module (the AllReduce
/// kernel's, and those of the release stores of the one-thread protocol kernels: the ticket and
/// end kernels, the graph arrival and end kernels), no external function (the driver resolves
/// none for this module, so it loads on every driver), a reduce issues 8 16-byte loads
/// before its first float add, and fp16/bf16 narrow in hardware.
fn the_static_targets_hold(arch: &str, report: &str, cubin: &std::path::Path) {
    let mut function = "";
    let (mut functions, mut data_loops) = (0, 0);
    for line in report.lines().filter(|l| l.starts_with(arch)) {
        if let Some((_, name)) = line.split_once("Function properties for ") {
            function = name.trim();
        } else if line.contains("bytes spill stores") {
            functions += 1;
            if function.contains("sg_apply") || function.contains("sg_copy_elems") {
                data_loops += 1;
            }
            assert!(
                line.contains(" 0 bytes spill stores, 0 bytes spill loads"),
                "{arch}: {function} spills: {line}"
            );
        }
    }
    assert!(
        data_loops >= 40 && functions > data_loops,
        "{arch}: {functions} functions, {data_loops} data loops in ptxas's report:\n{report}"
    );
    let Some(sass) = sass_of(cubin) else {
        return;
    };
    let fences = sass
        .lines()
        .filter(|l| l.contains("MEMBAR") && l.contains(".SYS"))
        .count();
    assert!(fences <= 40, "{arch}: {fences} system-scope fences");
    assert!(
        !sass.contains("EIATTR_EXTERNS") && !sass.contains("CALL.ABS"),
        "{arch}: the AllReduce module calls a function the driver resolves"
    );
    let (mut run, mut best) = (0, 0);
    for line in sass.lines() {
        let function_start = !line.starts_with(['.', ' ', '\t']) && line.ends_with(':');
        if function_start || line.contains("STG") {
            run = 0;
        }
        if line.contains("LDG.E.128") {
            run += 1;
        }
        if line.contains(" FADD ") || line.contains(" FADD.") {
            best = best.max(run);
            run = 0;
        }
    }
    assert!(
        best >= 8,
        "{arch}: at most {best} loads in flight before a float add"
    );
    assert!(
        sass.contains("F2FP"),
        "{arch}: no hardware fp16/bf16 conversion"
    );
    never_loops(arch, &sass, stragglar::gpu::kernels::TICKET_KERNEL, 0);
    the_steps_pay_two_barriers(arch, &sass);
    the_data_loops_keep_the_next_pass_in_flight(arch, &sass);
}

/// The registers an instruction's operand text names (`R12`; `R12.64` names R12 and R13).
fn registers_named(operands: &str) -> Vec<u32> {
    let mut named = Vec::new();
    let bytes = operands.as_bytes();
    for (at, _) in operands.match_indices('R') {
        let starts_word = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
        let digits: String = operands[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let Ok(register) = digits.parse::<u32>() else {
            continue;
        };
        if !starts_word {
            continue;
        }
        named.push(register);
        if operands[at + 1 + digits.len()..].starts_with(".64") {
            named.push(register + 1);
        }
    }
    named
}

/// Per function of the SASS whose name contains `name`: at each global store, how many
/// 16-byte loads were issued and their registers not yet touched by a later instruction
/// (in flight while the thread stores). Read in address order, loops not followed: a static
/// proxy, for code whose loads and stores are unrolled within a loop body.
fn loads_in_flight_at_stores(sass: &str, name: &str) -> Vec<(String, Vec<usize>)> {
    let mut functions: Vec<(String, Vec<usize>)> = Vec::new();
    let mut pending: Vec<Vec<u32>> = Vec::new();
    let mut inside = false;
    for line in sass.lines() {
        if !line.starts_with(['.', ' ', '\t', '/']) && line.ends_with(':') {
            inside = line.contains(name);
            if inside {
                functions.push((line.to_string(), Vec::new()));
            }
            pending.clear();
            continue;
        }
        let Some((_, code)) = line.split_once("*/") else {
            continue;
        };
        let code = code.trim().trim_end_matches(';').trim();
        let code = match code.strip_prefix('@') {
            Some(predicated) => predicated
                .split_once(' ')
                .map_or("", |(_, rest)| rest.trim()),
            None => code,
        };
        let (opcode, operands) = code.split_once(' ').unwrap_or((code, ""));
        if !inside || opcode.is_empty() {
            continue;
        }
        if opcode.starts_with("STG") {
            functions.last_mut().unwrap().1.push(pending.len());
        }
        let (written, read) = match opcode.starts_with("LDG.E.128") {
            true => operands.split_once(',').unwrap_or((operands, "")),
            false => ("", operands),
        };
        let read = registers_named(read);
        pending.retain(|load| !load.iter().any(|r| read.contains(r)));
        if let Some(&first) = registers_named(written).first() {
            pending.push((first..first + 4).collect());
        }
    }
    functions
}

/// The data loops are double-buffered: the next pass's loads are issued before this pass's
/// results are stored, so a thread stores with loads in flight. The combines (every
/// `sg_apply`) store with at least 6 loads of 16 bytes in flight somewhere (4 of the next
/// pass and 2 of this one's second vector in the exchange's loop), and the copy with 8; the
/// loops that issued one pass and then stored it had at most 4. A proxy: a single-buffered
/// pass twice as wide would pass too, but those shapes spill, which the spill check refuses.
fn the_data_loops_keep_the_next_pass_in_flight(arch: &str, sass: &str) {
    for (name, least) in [("sg_apply", 6), ("sg_copy_elems", 8)] {
        let functions = loads_in_flight_at_stores(sass, name);
        assert!(!functions.is_empty(), "{arch}: no {name} in the SASS");
        for (function, at_stores) in functions {
            let most = at_stores.iter().copied().max().unwrap_or(0);
            assert!(
                most >= least,
                "{arch}: {function} stores with at most {most} loads in flight (want {least})"
            );
        }
    }
}

/// A step (`sg_step`) and a chunk of the straggler's copy-in (`sg_copy_in`'s loop) each meet
/// at most two block barriers: their functions' SASS holds two `BAR.SYNC` each (the scratch is
/// double-buffered, so no barrier guards it before a step's waits). A step whose value is
/// pushed into its readers (a multicast plan's) adds `sg_push_made`'s one.
fn the_steps_pay_two_barriers(arch: &str, sass: &str) {
    for function in [
        "7sg_stepEPK7sg_call",
        "10sg_copy_inEPK7sg_call",
        "12sg_push_madeEPK7sg_call",
    ] {
        let body: Vec<&str> = sass
            .lines()
            .skip_while(|l| !(l.starts_with('$') && l.ends_with(':') && l.contains(function)))
            .skip(1)
            .take_while(|l| !(l.starts_with('$') && l.ends_with(':')))
            .collect();
        assert!(body.len() > 20, "{arch}: no {function} in the SASS");
        let barriers = body.iter().filter(|l| l.contains("BAR.SYNC")).count();
        let allowed = if function.contains("sg_push_made") {
            1..=1
        } else {
            1..=2
        };
        assert!(
            allowed.contains(&barriers),
            "{arch}: {barriers} block barriers in {function}"
        );
    }
}

/// The kernel `name`, which runs before a call NCCL runs (the ticket kernel before an eager one,
/// the turn kernel before a graph replay's), never waits: its SASS has no backward branch, but
/// for the self-branch the compiler pads after the final `EXIT` (never reached), and makes
/// `driver_calls` calls, each through an address the driver fills in when it loads the module
/// (`CALL.ABS.NOINC`: see [`the_turn_module_calls_only_cudagraphsetconditional`]), and no other.
fn never_loops(arch: &str, sass: &str, name: &str, driver_calls: usize) {
    let body: Vec<&str> = sass
        .lines()
        .skip_while(|l| *l != format!("{name}:"))
        .skip(1)
        .take_while(|l| !l.starts_with("//---"))
        .collect();
    assert!(body.len() > 20, "{arch}: no {name} in the SASS");
    // Each label's address: that of the instruction after it.
    let address = |line: &str| -> Option<u32> {
        let at = line.trim_start().strip_prefix("/*")?.split_once("*/")?.0;
        u32::from_str_radix(at, 16).ok()
    };
    let mut labels = std::collections::HashMap::new();
    for (i, line) in body.iter().enumerate() {
        if let Some(label) = line.strip_suffix(':').filter(|l| l.starts_with(".L_")) {
            if let Some(at) = body[i + 1..].iter().find_map(|l| address(l)) {
                labels.insert(label.to_string(), at);
            }
        }
    }
    let (mut branches, mut calls) = (0, 0);
    for (i, line) in body.iter().enumerate() {
        if line.contains("CALL") {
            assert!(
                line.contains("CALL.ABS.NOINC"),
                "{arch}: {name} calls: {line}"
            );
            calls += 1;
        }
        let Some((_, target)) = line.split_once("BRA") else {
            continue;
        };
        branches += 1;
        let target = target.split('(').nth(1).and_then(|t| t.split(')').next());
        let (Some(target), Some(at)) = (target, address(line)) else {
            panic!("{arch}: a branch without a target: {line}");
        };
        let to = labels[target];
        let after_exit = body[..i]
            .iter()
            .rev()
            .find(|l| address(l).is_some())
            .is_some_and(|l| l.contains("EXIT") && !l.contains('@'));
        let padding = to == at && !line.contains('@') && after_exit;
        assert!(to > at || padding, "{arch}: {name} branches back: {line}");
    }
    assert!(branches >= 2, "{arch}: {branches} branches in {name}");
    assert_eq!(calls, driver_calls, "{arch}: calls in {name}");
}

/// The turn kernel's module (`stragglar_turn_<arch>.cubin`): its one external function, whose
/// address the driver writes into constant bank 4 when it loads the module, is the device
/// runtime's `cudaGraphSetConditional` (so only a driver with conditional nodes loads it, and
/// the AllReduce module, which names none, loads everywhere); the turn kernel calls it three
/// times and never waits.
fn the_turn_module_calls_only_cudagraphsetconditional(arch: &str, cubin: &std::path::Path) {
    let Some(sass) = sass_of(cubin) else {
        return;
    };
    let bank: Vec<&str> = sass
        .lines()
        .skip_while(|l| !l.starts_with(".nv.constant4:"))
        .skip(1)
        .take_while(|l| !l.starts_with("//---"))
        .filter(|l| l.contains(".dword"))
        .collect();
    assert_eq!(bank.len(), 1, "{arch}: constant bank 4: {bank:?}");
    assert_eq!(
        bank[0].split_whitespace().last(),
        Some("cudaGraphSetConditional"),
        "{arch}: {}",
        bank[0]
    );
    never_loops(arch, &sass, stragglar::gpu::kernels::GRAPH_TURN_KERNEL, 3);
}

#[test]
fn the_kernel_cache_compiles_once_then_reuses_the_entry() {
    if !nvrtc_available() {
        return;
    }
    use stragglar::gpu::nvrtc::{Origin, Unit};
    // A tiny unit with our two kernels' names (what a valid entry must hold): the cache's
    // logic, not NVRTC's time on our kernels, is under test.
    let unit = Unit::from_text(
        "extern \"C\" __global__ void ncclStragglarAllReduce(int *x) { if (x) *x = 1; }\n\
         extern \"C\" __global__ void ncclStragglarApplyProbe(int *x) { if (x) *x = 2; }\n",
    );
    let dir = support::scratch("kernel-cache-test");
    let (first, origin) = unit.cubin_cached("sm_90", Some(&dir)).unwrap();
    assert_eq!(origin, Origin::Compiled);
    let (second, origin) = unit.cubin_cached("sm_90", Some(&dir)).unwrap();
    assert_eq!(origin, Origin::Cache);
    assert_eq!(first, second);
    // Its entry is its own: our kernels' is another.
    let entry = dir.join(unit.cache_key("sm_90"));
    assert_ne!(
        unit.cache_key("sm_90"),
        stragglar::gpu::nvrtc::cache_key("sm_90")
    );
    assert_eq!(stragglar::gpu::nvrtc::read_cached("sm_90", &dir), None);
    // The entry names the NVRTC that compiled it, and is found without NVRTC.
    let (cached, built_by) = unit.read_cached("sm_90", &dir).unwrap();
    assert_eq!(cached, first);
    assert_eq!(Some(built_by), stragglar::gpu::nvrtc::version());
    assert!(std::fs::read(&entry).unwrap().ends_with(&first));
    // A damaged entry is not trusted: it is recompiled and replaced.
    std::fs::write(&entry, b"garbage").unwrap();
    let (third, origin) = unit.cubin_cached("sm_90", Some(&dir)).unwrap();
    assert_eq!(origin, Origin::Compiled);
    assert_eq!(third, first);
    assert!(std::fs::read(&entry).unwrap().ends_with(&first));
    // An entry for another architecture is not this one's.
    std::fs::copy(&entry, dir.join(unit.cache_key("sm_80"))).unwrap();
    assert_eq!(unit.read_cached("sm_80", &dir), None);
}

#[test]
fn stragglar_kernels_refuses_an_unknown_architecture() {
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_stragglar"))
        .args(["kernels", "--arch", "sm_60"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("sm_60"));
}

/// Every synchronising access of the kernels is at system scope, checked from below in the PTX
/// (inline PTX reaches it verbatim): each load or store with a memory order, each atomic,
/// reduction and fence names `.sys` (or is `.volatile`, which PTX treats as relaxed at system
/// scope), but the one gpu-scope atomic, the counter of a launch's finished blocks in its own
/// GPU's memory (no other agent touches it: the emulated driver checks that at run time).
/// A flag, turn, board or failure word narrowed to `.gpu` passes a single GPU and fails here.
#[test]
fn every_synchronising_access_in_the_ptx_is_at_system_scope() {
    if !nvrtc_available() {
        return;
    }
    let ptx = ptx_for_sm_90(stragglar::gpu::kernels::translation_unit());
    // The multicast path's alias fences, both in the step function (`sg_step`, outlined): the
    // reader's after its flag's wait, and the writer's in the publish it inlines (the host
    // emulation has one address per byte and cannot miss either, so the PTX must show both).
    // An owner never reads a value it pushes (the lowering refuses it), so needs none.
    let lines: Vec<&str> = ptx.lines().collect();
    let is_function = |l: &str| l.starts_with(".func") || l.contains(".entry");
    let step = lines
        .iter()
        .position(|l| is_function(l) && l.contains("7sg_stepEPK7sg_call"))
        .expect("sg_step in the PTX");
    let step_end = (step + 1..lines.len())
        .find(|&i| is_function(lines[i]))
        .unwrap_or(lines.len());
    let alias_fences = lines[step..step_end]
        .iter()
        .filter(|l| l.trim() == "fence.proxy.alias;")
        .count();
    assert_eq!(
        alias_fences, 2,
        "fence.proxy.alias in sg_step (want the reader's and the writer's)"
    );
    let seen = synchronising_accesses(&ptx);
    eprintln!("{seen:#?}");
    for needed in [
        "ld.acquire.sys.global.u32",
        "st.release.sys.global.u32",
        "st.release.sys.global.u64",
        "atom.acq_rel.sys.global.add.u64",
        GPU_SCOPE_COUNTER,
    ] {
        assert!(
            seen.contains_key(needed),
            "no {needed} in the PTX: {seen:?}"
        );
    }

    // The turn kernel's module: its ticket is taken and its notes released at system scope too.
    let ptx = ptx_for_sm_90(stragglar::gpu::kernels::turn_translation_unit());
    let seen = synchronising_accesses(&ptx);
    eprintln!("the turn kernel's module: {seen:#?}");
    for needed in [
        "st.release.sys.global.u64",
        "atom.acq_rel.sys.global.add.u64",
    ] {
        assert!(
            seen.contains_key(needed),
            "no {needed} in the turn kernel's PTX: {seen:?}"
        );
    }
}

/// `unit` as NVRTC compiles it to PTX for compute_90, with the library's options.
fn ptx_for_sm_90(unit: String) -> String {
    let options = CompileOptions {
        arch: Some("compute_90"),
        options: vec!["--fmad=false".into(), "--std=c++17".into()],
        ..Default::default()
    };
    compile_ptx_with_opts(unit, options)
        .unwrap_or_else(|e| panic!("{e:?}"))
        .to_src()
}

/// The counter of a launch's finished blocks, in its own GPU's memory (no other agent touches
/// it): the one synchronising access at GPU scope.
const GPU_SCOPE_COUNTER: &str = "atom.acq_rel.gpu.global.add.u32";

/// Each synchronising access of `ptx` (an ordered load or store, an atomic, a fence) by opcode,
/// with how many there are; asserts that each is at system scope, but [`GPU_SCOPE_COUNTER`].
fn synchronising_accesses(ptx: &str) -> std::collections::BTreeMap<String, usize> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for line in ptx.lines() {
        let mut words = line.split_whitespace();
        let mut opcode = words.next().unwrap_or("");
        if opcode.starts_with('@') {
            opcode = words.next().unwrap_or("");
        }
        let parts: Vec<&str> = opcode.trim_end_matches(';').split('.').collect();
        let ordered = parts
            .iter()
            .any(|p| ["acquire", "release", "relaxed", "acq_rel", "sc", "volatile"].contains(p));
        // `fence.proxy.alias` orders one thread's accesses through two addresses of the same
        // memory (a multicast address and a member's own); it has no scope to narrow.
        let strong = match parts[0] {
            "ld" | "st" => ordered,
            "fence" => parts.get(1) != Some(&"proxy"),
            "atom" | "red" | "membar" => true,
            _ => false,
        };
        if !strong || parts.contains(&"shared") || parts.contains(&"local") {
            continue;
        }
        let system = parts.contains(&"sys") || parts.contains(&"volatile");
        assert!(
            system || opcode == GPU_SCOPE_COUNTER,
            "a synchronising access narrower than .sys: {}",
            line.trim()
        );
        *seen.entry(opcode.to_string()).or_default() += 1;
    }
    seen
}
