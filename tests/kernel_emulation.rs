//! The CUDA kernel source, compiled by the host C++ compiler with `STRAGGLAR_HOST_EMULATION`
//! (one OS thread per GPU thread, a pthread barrier per block, C++ atomics for the PTX
//! acquire/release), executing real plans on ranks that are threads of this process: the same
//! plan interpretation, slicing, flags, epochs, parities, aborts and timeouts the GPU runs,
//! checked bit for bit against the plan interpreter (`plan::simulate`) on every rank. Each
//! rank's staging is laid out by the library's `StagingLayout` and every launch's arguments
//! are built by the library's `LaunchSite`, so the library's launches are what is checked.

mod support;

use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use stragglar::engine::cuda::args::{LaunchSite, MulticastRegion, Operands};
use stragglar::engine::cuda::staging::StagingLayout;
use stragglar::gpu::arrival::{
    measures, RawArrival, RawBoardSlot, RawRingEntry, RawTicket, BOARD_SLOTS, COLLECT_BY,
    LEAD_FROM_SPANS, POST_UNMEASURED, RING_ENTRIES,
};
use stragglar::gpu::choice::{RawDetector, RawGraphState, RawRule};
use stragglar::gpu::kernels::op_code;
use stragglar::gpu::launch::{
    RawApply, RawLaunch, RawPeer, STATUS_ABORTED, STATUS_BAD_PLAN, STATUS_OK, STATUS_PEER_FAILED,
    STATUS_TIMEOUT,
};
use stragglar::plan::{simulate, Lowered, Plan};
use stragglar::plan::{PlanCache, Shape};
use stragglar::reduce::{DataType, ReduceOp, Scale};
use stragglar::schedule::Algorithm;

/// `stragglar_emulate_thread`: one GPU thread of the AllReduce kernel (its block's two
/// barriers, its scratch, and the rank's arrival gate or null).
type ThreadFn = unsafe extern "C" fn(
    *const RawLaunch,
    u32,
    u32,
    *mut libc::pthread_barrier_t,
    *mut c_void,
    *const u32,
);
/// `stragglar_emulate_plan_threads`: the threads of the block running a plan block that meet
/// at its plan barrier.
type PlanThreadsFn = unsafe extern "C" fn(*const RawLaunch, u32) -> u32;
/// `stragglar_emulate_block_share`: a plan block's bytes `[out[0], out[1])` of a chunk (bytes,
/// block, blocks, threads, arrival lanes, out).
type BlockShareFn = unsafe extern "C" fn(u64, u64, u64, u64, u64, *mut u64);
/// `stragglar_emulate_apply_thread`: one GPU thread of the bandwidth probe.
type ApplyFn = unsafe extern "C" fn(
    *const RawApply,
    u32,
    u32,
    u32,
    u32,
    *mut libc::pthread_barrier_t,
    *mut c_void,
);

/// `stragglar_emulate_ticket` and `stragglar_emulate_ticket_end`: the ticket kernel's and the
/// end kernel's one working thread.
type TicketFn = unsafe extern "C" fn(*const RawTicket);

/// `stragglar_emulate_rule`: the device rule over a record stream, one choice per record.
type RuleFn =
    unsafe extern "C" fn(*const RawRule, *mut RawDetector, *const u32, *const u32, u32, *mut u32);

/// `stragglar_emulate_graph_call`: one graph call's choice and feed, without protocol or plan.
type GraphCallFn = unsafe extern "C" fn(*mut RawGraphState, *const RawRule) -> u32;

/// `stragglar_emulate_layout`: the kernel's chunk ranges and slot size for a count and type.
type LayoutFn = unsafe extern "C" fn(u64, u32, u32, *mut u64);

/// `stragglar_emulate_half`: the kernel's fp16 or bf16 conversions over arrays.
type HalfFn = unsafe extern "C" fn(u32, *const u16, *mut f32, *const f32, *mut u16, u64);

/// Waits (at most 10 s) until `count` of `ranks` ranks took their ticket of call `call` on the
/// arrival board at `board`, then `delay`.
fn await_tickets(board: u64, ranks: usize, call: u64, count: usize, delay: Duration) {
    let slot =
        board as usize + (call % BOARD_SLOTS as u64) as usize * std::mem::size_of::<RawBoardSlot>();
    let first = (call / BOARD_SLOTS as u64) * ranks as u64;
    // SAFETY: `arrived` is the slot's first word, a live aligned u64 that the emulated kernels
    // only touch atomically.
    let arrived = unsafe { std::sync::atomic::AtomicU64::from_ptr(slot as *mut u64) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while arrived.load(Ordering::Acquire) < first + count as u64 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    std::thread::sleep(delay);
}

/// The emulated kernel, compiled once per test binary.
struct Kernel {
    half: HalfFn,
    thread: ThreadFn,
    plan_threads: PlanThreadsFn,
    block_share: BlockShareFn,
    apply: ApplyFn,
    ticket: TicketFn,
    ticket_end: TicketFn,
    rule: RuleFn,
    graph_call: GraphCallFn,
    /// `stragglar_emulate_measures`: whether a graph call on NCCL's turn is in the sample.
    measures: unsafe extern "C" fn(u64) -> u32,
    layout: LayoutFn,
    /// `stragglar_emulate_served_out_of_order`: turns the kernel handed on out of order (to a
    /// word that had passed them), in every test of this binary so far.
    served_out_of_order: unsafe extern "C" fn() -> u64,
    /// `stragglar_emulate_multicast`: registers (or, with no members, removes) a multicast
    /// object of the OS-thread harness.
    multicast: MulticastFn,
    /// `stragglar_emulate_multimem_stores`: multimem stores the harness wrote so far, in every
    /// test of this binary.
    multimem_stores: unsafe extern "C" fn() -> u64,
    /// `stragglar_emulate_loop_multimem_stores`: of those, the ones the data loops made.
    loop_multimem_stores: unsafe extern "C" fn() -> u64,
    scratch_bytes: usize,
}

/// `stragglar_emulate_multicast`.
type MulticastFn = unsafe extern "C" fn(u64, u64, *const u64, u32) -> i32;

/// A thread scope whose threads are joined one by one (`pthread_join`) at its end, so that
/// ThreadSanitizer (`STRAGGLAR_EMULATION_CFLAGS=-fsanitize=thread`) sees each emulated thread's
/// work happen before what follows: `std::thread::scope` waits on an atomic counter, which it
/// cannot see.
struct Joined<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    handles: std::cell::RefCell<Vec<std::thread::ScopedJoinHandle<'scope, ()>>>,
}

impl<'scope> Joined<'scope, '_> {
    fn spawn<T>(&self, f: impl FnOnce() -> T + Send + 'scope) {
        let handle = self.scope.spawn(move || {
            f();
        });
        self.handles.borrow_mut().push(handle);
    }
}

/// [`std::thread::scope`], with every thread joined explicitly (see [`Joined`]); a thread's
/// panic is the scope's.
fn scoped<'env, T>(f: impl for<'scope> FnOnce(&Joined<'scope, 'env>) -> T) -> T {
    std::thread::scope(|scope| {
        let joined = Joined {
            scope,
            handles: Default::default(),
        };
        let out = f(&joined);
        for handle in joined.handles.take() {
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
        out
    })
}

fn kernel() -> &'static Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    KERNEL.get_or_init(|| {
        let dir = support::root().join("target").join("kernel-emulation");
        std::fs::create_dir_all(&dir).unwrap();
        let lib: PathBuf = dir.join(format!("libemulated-{}.so", std::process::id()));
        // Extra flags (ThreadSanitizer: `-fsanitize=thread`, with libtsan preloaded into the
        // test binary); the library is then kept, for the reports' symbols.
        let extra = std::env::var("STRAGGLAR_EMULATION_CFLAGS").unwrap_or_default();
        let out = Command::new("c++")
            .args([
                "-x",
                "c++",
                "-std=c++17",
                "-O2",
                "-fPIC",
                "-shared",
                "-pthread",
            ])
            .args(extra.split_whitespace())
            .args(["-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"])
            .args(["-ffp-contract=off", "-DSTRAGGLAR_HOST_EMULATION", "-I"])
            .arg(support::root().join("cuda"))
            .arg(support::root().join("cuda/stragglar_allreduce.cu"))
            .arg("-o")
            .arg(&lib)
            .output()
            .expect("c++ runs");
        assert!(
            out.status.success(),
            "the kernel source does not compile for the host:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = CString::new(lib.to_str().unwrap()).unwrap();
        // SAFETY: dlopen of a library we just built; the handle is never closed (the kernel
        // lives as long as the test binary).
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen {}", lib.display());
        if extra.is_empty() {
            let _ = std::fs::remove_file(&lib);
        }
        let symbol = |name: &str| {
            let name = CString::new(name).unwrap();
            // SAFETY: a valid handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            assert!(!p.is_null(), "{name:?}");
            p
        };
        let scratch: unsafe extern "C" fn() -> u64 =
            // SAFETY: the symbol has this signature in stragglar_allreduce.cu.
            unsafe { std::mem::transmute(symbol("stragglar_emulate_scratch_bytes")) };
        // The exported function `$name`, as `$ty`.
        macro_rules! export {
            ($ty:ty, $name:literal) => {
                // SAFETY: each symbol named below has this signature in stragglar_allreduce.cu.
                unsafe { std::mem::transmute::<*mut c_void, $ty>(symbol($name)) }
            };
        }
        Kernel {
            apply: export!(ApplyFn, "stragglar_emulate_apply_thread"),
            ticket: export!(TicketFn, "stragglar_emulate_ticket"),
            ticket_end: export!(TicketFn, "stragglar_emulate_ticket_end"),
            rule: export!(RuleFn, "stragglar_emulate_rule"),
            graph_call: export!(GraphCallFn, "stragglar_emulate_graph_call"),
            measures: export!(
                unsafe extern "C" fn(u64) -> u32,
                "stragglar_emulate_measures"
            ),
            served_out_of_order: export!(
                unsafe extern "C" fn() -> u64,
                "stragglar_emulate_served_out_of_order"
            ),
            half: export!(HalfFn, "stragglar_emulate_half"),
            layout: export!(LayoutFn, "stragglar_emulate_layout"),
            thread: export!(ThreadFn, "stragglar_emulate_thread"),
            plan_threads: export!(PlanThreadsFn, "stragglar_emulate_plan_threads"),
            block_share: export!(BlockShareFn, "stragglar_emulate_block_share"),
            multicast: export!(MulticastFn, "stragglar_emulate_multicast"),
            multimem_stores: export!(
                unsafe extern "C" fn() -> u64,
                "stragglar_emulate_multimem_stores"
            ),
            loop_multimem_stores: export!(
                unsafe extern "C" fn() -> u64,
                "stragglar_emulate_loop_multimem_stores"
            ),
            // SAFETY: a plain function without arguments.
            scratch_bytes: unsafe { scratch() } as usize,
        }
    })
}

/// 16-byte aligned zeroed bytes.
struct Aligned(Vec<u128>);

impl Aligned {
    fn new(bytes: usize) -> Self {
        Aligned(vec![0; bytes.div_ceil(16).max(1)])
    }
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 16;
        // SAFETY: the Vec owns `len` initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), len) }
    }
}

/// The flag of call `epoch` (its epoch as the kernel's 32-bit flags hold it, never 0).
fn call_flag(epoch: u64) -> u32 {
    ((epoch - 1) % 0xffff_ffff) as u32 + 1
}

/// `turns[reader][source]`: the turns after the first (those a read waits for) in which
/// `reader` reads `source` in `plan`, ascending.
fn turns_read(plan: &Plan, ranks: usize) -> Vec<Vec<Vec<u64>>> {
    plan.programs
        .iter()
        .enumerate()
        .map(|(reader, program)| {
            let mut turns = vec![Vec::new(); ranks];
            for step in &program.steps {
                let (sources, turn) = step.reads();
                for s in sources.iter().filter(|s| s.rank != reader) {
                    if let Some(turn) = turn.filter(|&t| t > 0) {
                        turns[s.rank].push(turn as u64);
                    }
                }
            }
            for list in &mut turns {
                list.sort_unstable();
            }
            turns
        })
        .collect()
}

/// One rank's device-side state, as the library allocates it: one staging allocation laid
/// out by the library's `StagingLayout` (arenas, flags, turn words, failure word, epoch,
/// finished blocks, rank 0's arrival board, graph state), and its host-mapped words.
struct RankMemory {
    staging: Aligned,
    status: Aligned,
    /// The rank's failure word (in host memory, as the library keeps it), which every peer
    /// reads.
    failed: Aligned,
    /// `RawRingEntry[RING_ENTRIES]`: the records this rank copied.
    ring: Aligned,
}

/// A communicator of `ranks` emulated GPUs with a fixed grid.
struct Comm {
    ranks: usize,
    blocks: u32,
    threads: u32,
    layout: StagingLayout,
    memory: Vec<RankMemory>,
    peers: Vec<RawPeer>,
    abort: Aligned,
    timeout_ns: u64,
    calls: u64,
    /// Whether launches record arrivals (plan block 0's last thread), and the next ticketed call.
    ticketing: bool,
    arrivals: std::cell::Cell<u64>,
    /// Records `0..collected` are collected by launches already run (as `CudaRank` counts).
    collected: std::cell::Cell<u64>,
    /// A rank that launches this long after the others, for the next call only.
    late: Option<(usize, Duration)>,
    /// How long the work of a call that goes to NCCL takes once every rank has taken its
    /// ticket (what NCCL's kernel would take), before each rank's end kernel runs.
    nccl_time: Duration,
    /// The next ticketed call to NCCL runs no end kernel (as when NCCL's launch was never
    /// reported), for that call only.
    skip_end: bool,
    /// Ticketed calls to NCCL run their end kernels even when some rank did not launch (a
    /// rank that never arrives: what a collection waiting for its record does).
    end_without_all: bool,
    /// Ticketed calls to NCCL run their end kernels only where the library does: on the
    /// sample it measures, and once `COLLECT_BY` records wait (otherwise on every call).
    sampled: bool,
    /// `RawLaunch::ordered_reads` of every launch (on unless a test turns it off).
    ordered_reads: bool,
    /// Every rank's staging bound to one multicast object (`Comm::bind_multicast`).
    multicast: Option<MulticastRange>,
}

/// A multicast region of the harness: each rank's memory of both parities (`bytes` each), and
/// the region's multicast addresses, reserved with no access so that a plain load or store
/// through them faults (as PTX leaves it undefined); only the harness's multimem stores use
/// them, writing each rank's memory at the same offset. Removed and unmapped on drop.
struct MulticastRange {
    base: u64,
    /// Bytes of one parity.
    bytes: usize,
    memory: Vec<Aligned>,
}

impl MulticastRange {
    fn new(bytes: usize, ranks: usize) -> MulticastRange {
        // SAFETY: a fresh anonymous mapping with no access; nothing else owns it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "reserve the multicast addresses");
        let memory: Vec<Aligned> = (0..ranks).map(|_| Aligned::new(2 * bytes)).collect();
        let members: Vec<u64> = memory.iter().map(Aligned::addr).collect();
        let range = MulticastRange {
            base: base as u64,
            bytes,
            memory,
        };
        // SAFETY: `members` holds `ranks` addresses of `2 * bytes` each, alive as long as the
        // range, which owns them.
        let added = unsafe {
            (kernel().multicast)(
                range.base,
                2 * bytes as u64,
                members.as_ptr(),
                members.len() as u32,
            )
        };
        assert_eq!(added, 1, "register the multicast object");
        range
    }

    /// `rank`'s view of the region.
    fn region(&self, rank: usize) -> MulticastRegion {
        let own = self.memory[rank].addr();
        let bytes = self.bytes as u64;
        MulticastRegion {
            multicast: [self.base, self.base + bytes],
            own: [own, own + bytes],
            bytes,
        }
    }
}

impl Drop for MulticastRange {
    fn drop(&mut self) {
        // SAFETY: removes this range's registration, then unmaps the range this value mapped.
        unsafe {
            (kernel().multicast)(self.base, 0, std::ptr::null(), 0);
            libc::munmap(self.base as *mut c_void, 2 * self.bytes);
        }
    }
}

const ARENA_BYTES: usize = 1 << 20;
/// What the bytes past a call's arenas hold while it runs (see `Comm::poison_past_arenas`).
const POISON: u8 = 0xa5;
const MAX_VALUES: usize = 4096;

impl Comm {
    fn new(ranks: usize, blocks: u32, threads: u32) -> Comm {
        let layout = StagingLayout {
            arena_bytes: ARENA_BYTES as u64,
            values: MAX_VALUES as u64,
            blocks: blocks as u64,
            ranks: ranks as u64,
        };
        let memory: Vec<RankMemory> = (0..ranks)
            .map(|_| RankMemory {
                staging: Aligned::new(layout.allocation_bytes() as usize),
                status: Aligned::new(4),
                failed: Aligned::new(4),
                ring: Aligned::new(RING_ENTRIES as usize * std::mem::size_of::<RawRingEntry>()),
            })
            .collect();
        let peers = memory
            .iter()
            .map(|m| layout.peer(m.staging.addr(), m.failed.addr()))
            .collect();
        Comm {
            ranks,
            blocks,
            threads,
            layout,
            memory,
            peers,
            abort: Aligned::new(4),
            // A regression fails the test instead of hanging it.
            timeout_ns: 60_000_000_000,
            calls: 0,
            ticketing: true,
            arrivals: std::cell::Cell::new(0),
            collected: std::cell::Cell::new(0),
            late: None,
            nccl_time: Duration::ZERO,
            skip_end: false,
            end_without_all: false,
            sampled: false,
            ordered_reads: true,
            multicast: None,
        }
    }

    /// Gives every rank a multicast region of `bytes` per parity: launches then push the values
    /// a multicast plan sends to several readers with multimem stores, where they fit.
    fn bind_multicast(&mut self, bytes: usize) {
        self.multicast = Some(MulticastRange::new(bytes, self.ranks));
    }

    /// Where `rank`'s launches point, as the library builds them.
    fn site(&self, rank: usize) -> LaunchSite {
        LaunchSite {
            staging: self.memory[rank].staging.addr(),
            layout: self.layout,
            peer_table: self.peers.as_ptr() as u64,
            abort: self.abort.addr(),
            status: self.memory[rank].status.addr(),
            rank: rank as u32,
            ranks: self.ranks as u32,
            blocks: self.blocks,
            threads: self.threads,
            timeout_ns: self.timeout_ns,
            ordered_reads: self.ordered_reads,
            multicast: self.multicast.as_ref().map(|m| m.region(rank)),
        }
    }

    /// `len` bytes of `rank`'s staging from `offset` (a region of the layout).
    fn region(&mut self, rank: usize, offset: u64, len: usize) -> &mut [u8] {
        let offset = offset as usize;
        &mut self.memory[rank].staging.bytes()[offset..offset + len]
    }

    /// Rank 0's arrival board (`RawBoardSlot[BOARD_SLOTS]`), which every rank's tickets use.
    fn board(&self) -> u64 {
        self.memory[0].staging.addr() + self.layout.board()
    }

    /// Blocks per launch: the plan's (a launch that records its arrival does it in plan block
    /// 0's last thread).
    fn grid(&self) -> u32 {
        self.blocks
    }

    /// The arrival part of the next launch on `rank`, collecting `collect` records (the call
    /// number is taken by `prepare` or `tickets`, once per call for all ranks).
    fn arrival(&mut self, rank: usize, call: u64, collect: u32) -> RawArrival {
        if !self.ticketing {
            return RawArrival::default();
        }
        RawArrival {
            board: self.board(),
            ring: self.memory[rank].ring.addr(),
            call,
            ranks: self.ranks as u32,
            collect,
            note: self.memory[rank].staging.addr() + self.layout.arrival_note(),
        }
    }

    /// The records a collecting launch of call `call` copies (those of calls
    /// `collected ..= call - 2`), now noted as collected.
    fn collect(&self, call: u64) -> u32 {
        let count = call.saturating_sub(1).saturating_sub(self.collected.get());
        self.collected
            .set(self.collected.get().max(call.saturating_sub(1)));
        count as u32
    }

    /// Call `call`'s entry in `rank`'s ring.
    fn entry(&mut self, rank: usize, call: u64) -> RawRingEntry {
        let size = std::mem::size_of::<RawRingEntry>();
        let at = (call % RING_ENTRIES as u64) as usize * size;
        let bytes = &self.memory[rank].ring.bytes()[at..at + size];
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap());
        RawRingEntry {
            last: word(0),
            lead: word(1),
            post: word(2),
            span: word(3),
        }
    }

    /// The record of call `call` in `rank`'s ring, if it holds it whole: (last rank, lead ns),
    /// a lead worked out from the spans where the call was NCCL's (`LEAD_FROM_SPANS` where one
    /// of them was not measured).
    fn record(&mut self, rank: usize, call: u64) -> Option<(u32, u32)> {
        let entry = self.entry(rank, call);
        let tag = ((call % 0xffff_ffff) + 1) << 32;
        let words = [entry.last, entry.lead, entry.post, entry.span];
        if words.iter().any(|w| w >> 32 << 32 != tag) {
            return None;
        }
        let [last, lead, post, span] = words.map(|w| w as u32);
        if lead != LEAD_FROM_SPANS {
            return Some((last, lead));
        }
        let measured = post != POST_UNMEASURED && span != POST_UNMEASURED;
        Some((
            last,
            if measured {
                span.saturating_sub(post)
            } else {
                lead
            },
        ))
    }

    /// The record of call `call` (last rank, lead ns, post-arrival word), asserting that every
    /// rank's ring holds it, and the same one.
    fn agreed_record(&mut self, call: u64) -> (u32, u32, u32) {
        let (last, lead) = self.record(0, call).expect("rank 0 holds the record");
        let post = self
            .post(0, call)
            .expect("rank 0 holds the post-arrival time");
        for r in 1..self.ranks {
            assert_eq!(
                self.record(r, call),
                Some((last, lead)),
                "call {call} rank {r}"
            );
            assert_eq!(self.post(r, call), Some(post), "call {call} rank {r}");
        }
        (last, lead, post)
    }

    /// The post-arrival word (ns, or `POST_UNMEASURED`) of call `call` in `rank`'s ring, if it
    /// holds it.
    fn post(&mut self, rank: usize, call: u64) -> Option<u32> {
        let post = self.entry(rank, call).post;
        (post >> 32 == (call % 0xffff_ffff) + 1).then_some(post as u32)
    }

    /// Waits (at most 10 s) until `count` ranks took their ticket of call `call`, then `delay`:
    /// the late rank really arrives last, however loaded the machine.
    fn hold_back(&self, call: u64, count: usize, delay: Duration) {
        self.hold_back_on(self.board(), call, count, delay)
    }

    /// [`Comm::hold_back`] on the board at `board`.
    fn hold_back_on(&self, board: u64, call: u64, count: usize, delay: Duration) {
        await_tickets(board, self.ranks, call, count, delay)
    }

    /// Runs the ticket kernel on the ranks in `launched` (a call that goes to NCCL), the late
    /// rank (if any) after the others. When every rank is launched (or `end_without_all`), each
    /// then waits for the tickets and `nccl_time` (NCCL's kernel) and runs its end kernel,
    /// which collects the records waiting, unless `skip_end`.
    fn tickets(&mut self, launched: &[usize]) {
        let call = self.arrivals.get();
        self.arrivals.set(call + 1);
        let tickets: Vec<RawTicket> = (0..self.ranks)
            .map(|r| {
                let arrival = self.arrival(r, call, 0);
                self.site(r).ticket(arrival, self.timeout_ns)
            })
            .collect();
        let all = launched.len() == self.ranks || self.end_without_all;
        let waiting = call.saturating_sub(1).saturating_sub(self.collected.get());
        let measured = !self.sampled || measures(call) || waiting >= COLLECT_BY;
        let ends = all && !std::mem::take(&mut self.skip_end) && measured;
        let collect = if ends { self.collect(call) } else { 0 };
        let k = kernel();
        let late = self.late.take();
        let (board, ranks, nccl_time) = (self.board(), self.ranks, self.nccl_time);
        let arrived = launched.len();
        // NCCL's kernel ends on every rank together (an AllReduce cannot end on one rank before
        // the others reached it): without this, a thread the OS ran late would end late and
        // look like a rank that spent longer in the call.
        let leave_together = std::sync::Barrier::new(arrived);
        let leave_together = &leave_together;
        let run = move |t: &RawTicket| {
            // SAFETY: every address in the ticket is live memory of this Comm.
            unsafe { (k.ticket)(t) };
            if ends {
                await_tickets(board, ranks, call, arrived, nccl_time);
                leave_together.wait();
                let mut end = *t;
                end.arrival.collect = collect;
                // SAFETY: as above.
                unsafe { (k.ticket_end)(&end) };
            }
        };
        scoped(|scope| {
            let order = launched.iter().filter(|&&r| Some(r) != late.map(|l| l.0));
            for &r in order {
                let t = &tickets[r];
                scope.spawn(move || run(t));
            }
            if let Some((r, delay)) = late.filter(|l| launched.contains(&l.0)) {
                self.hold_back(call, launched.len() - 1, delay);
                let t = &tickets[r];
                scope.spawn(move || run(t));
            }
        });
    }

    fn status(&mut self, rank: usize) -> u32 {
        u32::from_le_bytes(self.memory[rank].status.bytes()[..4].try_into().unwrap())
    }

    /// Fills every rank's arenas past what `plan` needs of them with a pattern, so that
    /// [`Comm::assert_within_arenas`] can tell whether a call wrote past its slots.
    fn poison_past_arenas(&mut self, plan: &Plan) {
        assert!(plan.max_arena_bytes() <= ARENA_BYTES);
        for (rank, program) in plan.programs.iter().enumerate() {
            for parity in 0..2 {
                let arena = self.layout.arena(parity);
                self.region(rank, arena, ARENA_BYTES)[program.arena_bytes..].fill(POISON);
            }
        }
    }

    /// Fills, in both parities of each rank's arena, the `IN` chunks the kernel reads in the
    /// caller's input (`in_place[rank]`, see [`chunks_read_in_place`]) with the poison, so that
    /// [`Comm::assert_not_copied_in`] can tell whether the call copied them.
    fn poison_chunks_read_in_place(&mut self, plan: &Plan, in_place: &[Vec<usize>]) {
        for (rank, chunks) in in_place.iter().enumerate() {
            for parity in 0..2 {
                let arena = self.layout.arena(parity);
                let bytes = self.region(rank, arena, ARENA_BYTES);
                for &c in chunks {
                    bytes[plan.chunk_bytes(c)].fill(POISON);
                }
            }
        }
    }

    /// Panics if the call wrote into an `IN` chunk that its rank reads in the caller's input.
    fn assert_not_copied_in(&mut self, plan: &Plan, in_place: &[Vec<usize>], label: &str) {
        for (rank, chunks) in in_place.iter().enumerate() {
            for parity in 0..2 {
                let arena = self.layout.arena(parity);
                let bytes = self.region(rank, arena, ARENA_BYTES);
                for &c in chunks {
                    assert!(
                        bytes[plan.chunk_bytes(c)].iter().all(|&b| b == POISON),
                        "{label}: rank {rank} copied IN chunk {c}, which it reads in place"
                    );
                }
            }
        }
    }

    /// Panics if a call wrote past the arena bytes `plan` gives a rank (the staging that the
    /// library sizes from the same numbers would end there).
    fn assert_within_arenas(&mut self, plan: &Plan, label: &str) {
        for (r, program) in plan.programs.iter().enumerate() {
            for parity in 0..2 {
                let arena = self.layout.arena(parity);
                let past = &self.region(r, arena, ARENA_BYTES)[program.arena_bytes..];
                if let Some(at) = past.iter().position(|&b| b != POISON) {
                    panic!(
                        "{label}: rank {r} wrote {} B past its {} B arena (parity {parity})",
                        at + 1,
                        program.arena_bytes
                    );
                }
            }
        }
    }

    /// Writes into every rank's turn word for each source it reads in turn what a call 65,536
    /// calls before `epoch` (same parity) would have left there for the first turn it waits
    /// for: a word that the plans of all the calls between never touched. A tag of 16 bits
    /// would take it for this call's and let the read go early (which the emulation counts);
    /// the whole flag does not.
    fn plant_stale_turns(&mut self, plan: &Plan, epoch: u64) {
        if !self.ordered_reads {
            return;
        }
        let parity = (epoch & 1) as usize;
        let stale = call_flag(epoch).wrapping_sub(1 << 16);
        let blocks = self.blocks as usize;
        let served = self.layout.served(parity);
        for (reader, sources) in turns_read(plan, self.ranks).into_iter().enumerate() {
            let words = self.region(reader, served, sources.len() * blocks * 8);
            for (source, turns) in sources.iter().enumerate() {
                let Some(&first) = turns.first() else {
                    continue;
                };
                for block in 0..blocks {
                    let at = (source * blocks + block) * 8;
                    let value = u64::from(stale) << 32 | first;
                    words[at..at + 8].copy_from_slice(&value.to_le_bytes());
                }
            }
        }
    }

    /// Panics unless call `epoch` (which ran `plan`) left every rank's turn words as ordered
    /// reads leave them: a rank's word for a source, in every block, names the call and the
    /// last of the source's sends this rank read in turn after the first (the reader of the
    /// send before wrote it, after every earlier hand-on), and is not this call's where the
    /// rank read none; untouched without ordered reads.
    fn assert_every_send_served(&mut self, plan: &Plan, epoch: u64, label: &str) {
        let parity = (epoch & 1) as usize;
        let tag = u64::from(call_flag(epoch)) << 32;
        let ordered = self.ordered_reads;
        let blocks = self.blocks as usize;
        let served = self.layout.served(parity);
        for (reader, sources) in turns_read(plan, self.ranks).into_iter().enumerate() {
            let words = self
                .region(reader, served, sources.len() * blocks * 8)
                .to_vec();
            for (source, turns) in sources.iter().enumerate() {
                let turn = turns.last().copied().unwrap_or(0);
                for block in 0..blocks {
                    let at = (source * blocks + block) * 8;
                    let word = u64::from_le_bytes(words[at..at + 8].try_into().unwrap());
                    let at =
                        format!("{label}: rank {reader}'s turn word for {source}, block {block}");
                    if !ordered {
                        assert_eq!(word, 0, "{at}: unordered reads wrote a turn word");
                    } else if turn > 0 {
                        assert_eq!(word, tag | turn, "{at}: its last turn");
                    } else {
                        assert_ne!(
                            word >> 32,
                            tag >> 32,
                            "{at}: written with no turn to hand on"
                        );
                    }
                }
            }
        }
    }

    fn epoch(&mut self, rank: usize) -> u64 {
        let epoch = self.layout.epoch();
        u64::from_le_bytes(self.region(rank, epoch, 8).try_into().unwrap())
    }

    /// The plan blobs and launch arguments of one call on every rank. `inputs` and `outputs`
    /// are byte buffers with `offset` bytes of misalignment before the data.
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &mut self,
        plan: &Planned,
        op: ReduceOp,
        scales: &[Scale],
        inputs: &[Aligned],
        outputs: &[Aligned],
        offset: usize,
        in_place: bool,
        corrupt_plan_of: Option<usize>,
    ) -> (Vec<Vec<u64>>, Vec<RawLaunch>) {
        let (lowered, plan) = (&plan.lowered, &plan.plan);
        assert!(plan.max_arena_bytes() <= ARENA_BYTES && plan.total_values() <= MAX_VALUES);
        let call = self.arrivals.get();
        self.arrivals.set(call + 1);
        let collect = if self.ticketing {
            self.collect(call)
        } else {
            0
        };
        let arrivals: Vec<RawArrival> = (0..self.ranks)
            .map(|r| self.arrival(r, call, collect))
            .collect();
        let blobs: Vec<Vec<u64>> = (0..self.ranks)
            .map(|r| {
                let mut words = blob_words(lowered, r);
                if corrupt_plan_of == Some(r) {
                    words[0] ^= 1;
                }
                words
            })
            .collect();
        let launches: Vec<RawLaunch> = (0..self.ranks)
            .map(|r| {
                let input = inputs[r].addr() + offset as u64;
                let output = if in_place {
                    input
                } else {
                    outputs[r].addr() + offset as u64
                };
                let operands = Operands {
                    count: plan.count,
                    dtype: plan.dtype,
                    op,
                    scale: scales[r],
                    input,
                    output,
                };
                self.site(r)
                    .eager(blobs[r].as_ptr() as u64, arrivals[r], &operands)
            })
            .collect();
        (blobs, launches)
    }

    /// Runs one call on the ranks in `launched` (the others never arrive).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        plan: &Planned,
        op: ReduceOp,
        scales: &[Scale],
        inputs: &mut [Aligned],
        outputs: &mut [Aligned],
        offset: usize,
        in_place: bool,
        launched: &[usize],
        corrupt_plan_of: Option<usize>,
    ) {
        let (_blobs, launches) = self.prepare(
            plan,
            op,
            scales,
            inputs,
            outputs,
            offset,
            in_place,
            corrupt_plan_of,
        );
        let hold = self
            .ticketing
            .then(|| (self.board(), launches[0].arrival.call));
        self.execute(&launches, launched, self.grid(), hold, false);
        self.calls += 1;
    }

    /// Runs `launches[r]` for each rank `r` in `launched` as `grid` blocks; the late rank (if
    /// any) launches once the others took their ticket of `hold` (board, call), or after its
    /// delay alone when the launches take no ticket. With `arrival_first`, the late rank's
    /// arrival thread (plan block 0's last) runs to its end before its other threads go past
    /// the claim: as the last arrival it waits for nobody, and whatever it writes is in place
    /// before they read.
    fn execute(
        &mut self,
        launches: &[RawLaunch],
        launched: &[usize],
        grid: u32,
        hold: Option<(u64, u64)>,
        arrival_first: bool,
    ) {
        let k = kernel();
        let late = self.late.take();
        // Opened by the late rank's arrival thread when it returns (with `arrival_first`).
        let gate = AtomicU32::new(0);
        let gate = &gate;
        scoped(|scope| {
            let launch_rank = |r: usize, gated: bool| {
                for block in 0..grid {
                    let launch = &launches[r];
                    let threads = self.threads;
                    let gate = gated.then_some(gate);
                    scope.spawn(move || emulate_threads(k, launch, block, threads, gate));
                }
            };
            for &r in launched.iter().filter(|&&r| Some(r) != late.map(|l| l.0)) {
                launch_rank(r, false);
            }
            if let Some((r, delay)) = late.filter(|l| launched.contains(&l.0)) {
                match hold {
                    Some((board, call)) => {
                        self.hold_back_on(board, call, launched.len() - 1, delay)
                    }
                    None => std::thread::sleep(delay),
                }
                launch_rank(r, arrival_first);
            }
        });
    }

    /// `rank`'s graph state as its kernels left it.
    fn graph_state(&self, rank: usize) -> RawGraphState {
        let at = self.memory[rank].staging.addr() + self.layout.graph();
        // SAFETY: the staging holds one RawGraphState there, 16-byte aligned (all integers:
        // any bits are valid), and no kernel runs while the test reads it.
        unsafe { std::ptr::read(at as *const RawGraphState) }
    }

    /// Rank 0's graph board, which every rank's graph launches use.
    fn graph_board(&self) -> u64 {
        self.memory[0].staging.addr() + self.layout.graph_board()
    }

    /// Every rank's launch of one call captured into a graph, out of place, as an f32 sum of
    /// `count` elements without scaling: `tables[r]` lists rank `r`'s plan blobs by choice
    /// (straggler `s` at `s`, the baseline at `ranks`). The same arguments serve every replay.
    fn graph_launches(
        &self,
        count: usize,
        tables: &[Vec<u64>],
        rule: RawRule,
        inputs: &[Aligned],
        outputs: &[Aligned],
    ) -> Vec<RawLaunch> {
        (0..self.ranks)
            .map(|r| {
                let operands = Operands {
                    count,
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                    scale: Scale::None,
                    input: inputs[r].addr(),
                    output: outputs[r].addr(),
                };
                self.site(r).graph(
                    tables[r].as_ptr() as u64,
                    self.graph_board(),
                    rule,
                    &operands,
                )
            })
            .collect()
    }

    /// Replays a captured call on the ranks in `launched` (the late rank after the others'
    /// tickets; its arrival thread first with `arrival_first`, see [`Comm::execute`]).
    fn replay(&mut self, launches: &[RawLaunch], launched: &[usize], arrival_first: bool) {
        let call = self.graph_state(0).calls;
        let hold = Some((self.graph_board(), call));
        self.execute(launches, launched, self.blocks, hold, arrival_first);
    }
}

/// A schedule lowered for any count, and its plan of one count (the interpreter's reference).
struct Planned {
    lowered: Lowered,
    plan: Plan,
}

fn planned(cache: &mut PlanCache, shape: Shape, count: usize) -> Planned {
    Planned {
        lowered: cache.lowered(shape).unwrap().clone(),
        plan: cache.get(shape, count).unwrap().clone(),
    }
}

/// `plan`'s blob for `rank` (every count), as 8-byte words (8-byte aligned, as device memory
/// would be).
fn blob_words(plan: &Lowered, rank: usize) -> Vec<u64> {
    plan.blob(rank)
        .bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

/// Runs one block: `threads` OS threads sharing the block's barriers and scratch.
fn emulate_block(k: &Kernel, launch: &RawLaunch, block: u32, threads: u32) {
    emulate_threads(k, launch, block, threads, None)
}

/// Runs the `threads` threads of one block as OS threads sharing its two barriers (every
/// thread; the plan threads of the block with the arrival warp) and its scratch; with `gate`
/// (the rank's, zero until its arrival thread returns), its plan threads wait at it after the
/// claim.
fn emulate_threads(
    k: &Kernel,
    launch: &RawLaunch,
    block: u32,
    threads: u32,
    gate: Option<&AtomicU32>,
) {
    // SAFETY: a live launch; the function only reads it.
    let planned = unsafe { (k.plan_threads)(launch, 0) };
    assert!(
        planned >= 1 && planned <= threads,
        "{planned} of {threads} threads"
    );
    // A gate opens only when an arrival thread returns: a block with none would wait forever.
    assert!(
        gate.is_none() || planned < threads,
        "a gated launch without an arrival thread"
    );
    let mut barriers = [std::mem::MaybeUninit::<libc::pthread_barrier_t>::uninit(); 2];
    for (barrier, count) in barriers.iter_mut().zip([threads, planned]) {
        // SAFETY: initialising a barrier we own.
        let rc =
            unsafe { libc::pthread_barrier_init(barrier.as_mut_ptr(), std::ptr::null(), count) };
        assert_eq!(rc, 0);
    }
    let scratch = Aligned::new(k.scratch_bytes);
    let scratch_addr = scratch.addr() as usize;
    let barriers_addr = barriers.as_mut_ptr() as usize;
    let gate_addr = gate.map_or(0, |g| g.as_ptr() as usize);
    scoped(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                // SAFETY: the launch, barriers, scratch and gate outlive every thread of this
                // scope; the kernel body is the code under test.
                unsafe {
                    (k.thread)(
                        launch,
                        block,
                        thread,
                        barriers_addr as *mut libc::pthread_barrier_t,
                        scratch_addr as *mut c_void,
                        gate_addr as *const u32,
                    )
                }
            });
        }
    });
    for barrier in &mut barriers {
        // SAFETY: every participant has left the barrier.
        unsafe { libc::pthread_barrier_destroy(barrier.as_mut_ptr()) };
    }
    drop(scratch);
}

/// Deterministic pseudo-random bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// Small exact values, so every op is also exact (NaN-free data for the ops whose NaN payloads
/// the GPU canonicalises); `raw` gives arbitrary bit patterns instead.
fn input(
    dtype: DataType,
    op: ReduceOp,
    rank: usize,
    count: usize,
    seed: u64,
    raw: bool,
) -> Vec<u8> {
    let bytes = noise(seed ^ (rank as u64) << 20, count * dtype.size());
    if raw {
        return bytes;
    }
    bytes
        .chunks(dtype.size())
        .enumerate()
        .flat_map(|(i, b)| {
            let v = match op {
                ReduceOp::Prod => 1 - 2 * (b[0] as i64 % 2),
                _ => b[0] as i64 % 9 - 4 + (i % 3) as i64,
            };
            encode_value(dtype, v)
        })
        .collect()
}

fn encode_value(dtype: DataType, v: i64) -> Vec<u8> {
    use stragglar::reduce::float16::{f32_to_bf16, f32_to_f16};
    match dtype {
        DataType::I8 | DataType::U8 => vec![v as u8],
        DataType::I32 | DataType::U32 => (v as i32).to_le_bytes().to_vec(),
        DataType::I64 | DataType::U64 => v.to_le_bytes().to_vec(),
        DataType::F16 => f32_to_f16(v as f32).to_le_bytes().to_vec(),
        DataType::Bf16 => f32_to_bf16(v as f32).to_le_bytes().to_vec(),
        DataType::F32 => (v as f32).to_le_bytes().to_vec(),
        DataType::F64 => (v as f64).to_le_bytes().to_vec(),
    }
}

fn scales(dtype: DataType, op: ReduceOp, ranks: usize) -> Vec<Scale> {
    (0..ranks)
        .map(|r| {
            let scalar = encode_value(dtype, 1 + (r % 3) as i64);
            let mut b = [0u8; 8];
            b[..scalar.len()].copy_from_slice(&scalar);
            Scale::for_op(op, dtype, ranks, Some(b)).unwrap()
        })
        .collect()
}

/// Whether an fp32 or fp64 element is a NaN: their NaN payloads are not part of the reduction's
/// contract (which operand's payload an IEEE operation keeps is up to the compiler and the
/// hardware, and GPUs return a canonical NaN), so two NaNs compare equal here. An fp16 or bf16
/// NaN result is the canonical one, compared bit for bit (this returns false for them).
fn is_nan(dtype: DataType, e: &[u8]) -> bool {
    match dtype {
        DataType::F32 => f32::from_le_bytes(e.try_into().unwrap()).is_nan(),
        DataType::F64 => f64::from_le_bytes(e.try_into().unwrap()).is_nan(),
        _ => false,
    }
}

struct Case {
    algorithm: Algorithm,
    /// Pieces per chunk (pipelined StragglAR; 1 otherwise).
    pieces: usize,
    ranks: usize,
    straggler: usize,
    dtype: DataType,
    op: ReduceOp,
    count: usize,
    offset: usize,
    in_place: bool,
    raw: bool,
    seed: u64,
}

/// The `IN` chunks of each rank that the kernel reads in the caller's input rather than copy
/// (`sg_input_in_place`): its own chunks that no other rank's step reads, when the call
/// scales nothing and the input is 16-byte aligned.
fn chunks_read_in_place(plan: &Plan, scales: &[Scale], input_aligned: bool) -> Vec<Vec<usize>> {
    let chunks = plan.chunks.len();
    (0..plan.ranks)
        .map(|rank| {
            if !input_aligned || scales[rank] != Scale::None {
                return Vec::new();
            }
            (0..chunks)
                .filter(|&c| {
                    plan.programs.iter().enumerate().all(|(reader, program)| {
                        reader == rank
                            || program.steps.iter().all(|step| {
                                step.reads().0.iter().all(|s| s.rank != rank || s.id != c)
                            })
                    })
                })
                .collect()
        })
        .collect()
}

impl Case {
    /// The plan cache's key of this case's plan.
    fn shape(&self) -> Shape {
        Shape {
            algorithm: self.algorithm,
            ranks: self.ranks,
            straggler: self.straggler,
            dtype: self.dtype,
            pieces: self.pieces,
        }
    }
}

/// Runs `case` on `comm` and checks every rank against the plan interpreter, bit for bit.
fn check(comm: &mut Comm, cache: &mut PlanCache, case: &Case) {
    let plan = planned(cache, case.shape(), case.count);
    let bytes = case.count * case.dtype.size();
    let data: Vec<Vec<u8>> = (0..case.ranks)
        .map(|r| input(case.dtype, case.op, r, case.count, case.seed, case.raw))
        .collect();
    let scales = scales(case.dtype, case.op, case.ranks);
    let expected = simulate(&plan.plan, case.op, &data, &scales);
    let mut inputs: Vec<Aligned> = data
        .iter()
        .map(|d| {
            let mut a = Aligned::new(bytes + case.offset);
            a.bytes()[case.offset..case.offset + bytes].copy_from_slice(d);
            a
        })
        .collect();
    let mut outputs: Vec<Aligned> = (0..case.ranks)
        .map(|_| Aligned::new(bytes + case.offset))
        .collect();
    let everyone: Vec<usize> = (0..case.ranks).collect();
    let epoch_before = comm.epoch(0);
    comm.poison_past_arenas(&plan.plan);
    comm.plant_stale_turns(&plan.plan, epoch_before + 1);
    let aligned = (inputs[0].addr() + case.offset as u64) % 16 == 0;
    let in_place = chunks_read_in_place(&plan.plan, &scales, aligned);
    if let (Algorithm::Multicast, Some(s)) = (case.algorithm, plan.plan.straggler) {
        // The straggler of a multicast plan combines its input where it lies: no copy-in.
        if aligned && scales[s] == Scale::None {
            assert_eq!(in_place[s].len(), plan.plan.chunks.len());
        }
    }
    comm.poison_chunks_read_in_place(&plan.plan, &in_place);
    comm.run(
        &plan,
        case.op,
        &scales,
        &mut inputs,
        &mut outputs,
        case.offset,
        case.in_place,
        &everyone,
        None,
    );
    let label = format!(
        "{:?} n={} straggler={} {:?} {:?} count={} offset={} in_place={} raw={}",
        case.algorithm,
        case.ranks,
        case.straggler,
        case.dtype,
        case.op,
        case.count,
        case.offset,
        case.in_place,
        case.raw
    );
    comm.assert_within_arenas(&plan.plan, &label);
    comm.assert_not_copied_in(&plan.plan, &in_place, &label);
    comm.assert_every_send_served(&plan.plan, epoch_before + 1, &label);
    // SAFETY: a plain function without arguments.
    let out_of_order = unsafe { (kernel().served_out_of_order)() };
    assert_eq!(out_of_order, 0, "{label}: sends served out of turn order");
    for r in 0..case.ranks {
        assert_eq!(comm.status(r), STATUS_OK, "{label}: rank {r} status");
        assert_eq!(comm.epoch(r), epoch_before + 1, "{label}: rank {r} epoch");
        let got = if case.in_place {
            &mut inputs[r]
        } else {
            &mut outputs[r]
        };
        let got = &got.bytes()[case.offset..case.offset + bytes];
        let size = case.dtype.size();
        let differs =
            |(a, b): &(&[u8], &[u8])| a != b && !(is_nan(case.dtype, a) && is_nan(case.dtype, b));
        let mismatch = got
            .chunks(size)
            .zip(expected[r].chunks(size))
            .position(|p| differs(&p));
        if let Some(e) = mismatch {
            panic!(
                "{label}: rank {r} differs from the interpreter first at element {e}: {:02x?} != {:02x?}",
                &got[e * size..(e + 1) * size],
                &expected[r][e * size..(e + 1) * size]
            );
        }
    }
}

/// The kernel derives every chunk's range and every value's slot from the launch's count and
/// type (a blob serves every size): its arithmetic must be `plan::layout`'s, or ranks would
/// read each other's values at the wrong place and slots could overrun the staging.
#[test]
fn the_kernel_lays_out_every_count_and_type_as_the_plans_do() {
    use stragglar::plan::{chunk_ranges, slot_bytes, ALIGN_BYTES};
    let k = kernel();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut counts: Vec<u64> = (0..300).collect();
    counts.extend([1023, 4096, 65_537, 1 << 28, (1 << 36) + 5]);
    counts.extend((0..300).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % (1 << (x % 34))
    }));
    for dtype in DataType::ALL {
        let size = dtype.size();
        for chunks in [1usize, 2, 3, 7, 12, 31, 64, 255] {
            for &count in &counts {
                let mut out = vec![u64::MAX; 2 + 2 * chunks];
                // SAFETY: `out` holds the 2 + 2 * chunks words the function writes.
                unsafe {
                    (k.layout)(
                        count,
                        dtype.nccl_code() as u32,
                        chunks as u32,
                        out.as_mut_ptr(),
                    )
                };
                let count = count as usize;
                let label = format!("{dtype:?} x {count} in {chunks}");
                assert_eq!(
                    out[0] as usize,
                    (count * size).div_ceil(ALIGN_BYTES) * ALIGN_BYTES,
                    "{label}: IN"
                );
                assert_eq!(out[1] as usize, slot_bytes(count, size, chunks), "{label}");
                for (c, range) in chunk_ranges(count, size, chunks).iter().enumerate() {
                    let got = (out[2 + 2 * c] as usize, out[3 + 2 * c] as usize);
                    assert_eq!(
                        got,
                        (range.start * size, range.len() * size),
                        "{label}: {c}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_type_and_op_matches_the_interpreter_bit_for_bit() {
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(4, 3, 4);
    let mut seed = 1;
    for dtype in DataType::ALL {
        for op in ReduceOp::ALL {
            for in_place in [false, true] {
                seed += 1;
                check(
                    &mut comm,
                    &mut cache,
                    &Case {
                        pieces: 1,
                        algorithm: Algorithm::Stragglar,
                        ranks: 4,
                        straggler: (seed % 4) as usize,
                        dtype,
                        op,
                        count: 1000 + (seed % 7) as usize,
                        offset: 0,
                        in_place,
                        raw: false,
                        seed,
                    },
                );
            }
        }
    }
}

/// Multicast StragglAR's plans on the kernel: each owner's ReduceScatter chunk pushed into the
/// straggler, the straggler's complete chunks pushed into every early rank, rank by rank through
/// the peer mappings, or, with a multicast region, by multimem stores (whose addresses fault on
/// any plain access) into every rank's region, each value that fits it (a region of 4 KiB holds
/// the first values of a 1000-element call, all of a small one, and the rest go rank by rank):
/// every type and op at 4 ranks, 2 to 8 ranks with odd counts and misaligned buffers, bit for
/// bit as the interpreter on every rank; multimem stores made with a region, none without.
/// With a region that holds every value, each 16-byte unit of each value pushed to several
/// readers goes through it exactly once, whether the data loop stored it or the push after it.
#[test]
fn multicast_plans_push_their_values_and_match_the_interpreter_bit_for_bit() {
    let mut cache = PlanCache::default();
    let mut seed = 9000;
    let stores = || {
        // SAFETY: a plain function without arguments.
        unsafe { (kernel().multimem_stores)() }
    };
    let loop_stores = || {
        // SAFETY: a plain function without arguments.
        unsafe { (kernel().loop_multimem_stores)() }
    };
    // Multimem stores a call of `case` makes with a region that holds all its values.
    let units_multicast = |cache: &mut PlanCache, case: &Case| -> u64 {
        let plan = planned(cache, case.shape(), case.count).plan;
        let delivery = plan.delivery.as_ref().expect("a multicast plan");
        let mut units = 0;
        for (rank, values) in delivery.pushed_to.iter().enumerate() {
            for (value, readers) in values.iter().enumerate() {
                if readers.len() >= 2 {
                    let chunk = plan.programs[rank].values[value].chunk;
                    units += plan.chunk_bytes(chunk).len().div_ceil(16) as u64;
                }
            }
        }
        units
    };
    for region in [None, Some(ARENA_BYTES), Some(4096)] {
        let before = stores();
        let mut comm = Comm::new(4, 3, 4);
        if let Some(bytes) = region {
            comm.bind_multicast(bytes);
        }
        for dtype in DataType::ALL {
            for op in ReduceOp::ALL {
                seed += 1;
                let case = Case {
                    pieces: 1,
                    algorithm: Algorithm::Multicast,
                    ranks: 4,
                    straggler: (seed % 4) as usize,
                    dtype,
                    op,
                    count: 1000 + (seed % 7) as usize,
                    offset: 0,
                    in_place: seed % 2 == 0,
                    raw: false,
                    seed,
                };
                let (call_before, loop_before) = (stores(), loop_stores());
                check(&mut comm, &mut cache, &case);
                if region == Some(ARENA_BYTES) {
                    let units = units_multicast(&mut cache, &case);
                    let from_loops = loop_stores() - loop_before;
                    let label = format!("{dtype:?} {op:?}, {} elements", case.count);
                    assert_eq!(stores() - call_before, units, "{label}: multimem stores");
                    // Aligned buffers: the data loops store every whole slice; only a slice
                    // ending in a partial vector (the message's last) is pushed afterwards.
                    if case.count * dtype.size() % 16 == 0 {
                        assert_eq!(from_loops, units, "{label}: stored by the loops");
                    } else {
                        assert!(
                            0 < from_loops && from_loops < units,
                            "{label}: {from_loops}"
                        );
                    }
                }
            }
        }
        for ranks in [2usize, 3, 5, 8] {
            let mut comm = Comm::new(ranks, 2, 2);
            if let Some(bytes) = region {
                comm.bind_multicast(bytes);
            }
            for (count, offset) in [(1usize, 0usize), (7, 6), (4099, 4)] {
                seed += 1;
                let dtype = if offset % 4 == 0 {
                    DataType::F32
                } else {
                    DataType::Bf16
                };
                let case = Case {
                    pieces: 1,
                    algorithm: Algorithm::Multicast,
                    ranks,
                    straggler: (seed as usize) % ranks,
                    dtype,
                    op: ReduceOp::Sum,
                    count,
                    offset,
                    in_place: seed % 2 == 0,
                    raw: false,
                    seed,
                };
                check(&mut comm, &mut cache, &case);
            }
        }
        let made = stores() - before;
        assert_eq!(
            made > 0,
            region.is_some(),
            "{made} multimem stores, region {region:?}"
        );
    }
}

/// f32 values around every fp16 (or bf16) value: the value itself, the midpoints to its
/// neighbours (ties), one f32 ulp either side of them, and a stride through all f32 bit
/// patterns (NaNs, infinities, subnormals and overflow among them).
fn narrowing_sweep(widen: fn(u16) -> f32) -> Vec<f32> {
    let mut out = Vec::new();
    for h in 0..=u16::MAX {
        let f = widen(h);
        let next = widen(h.wrapping_add(1));
        if !f.is_finite() || !next.is_finite() {
            out.push(f);
            continue;
        }
        let mid = f / 2.0 + next / 2.0;
        for v in [f, mid] {
            let bits = v.to_bits();
            out.extend([
                v,
                f32::from_bits(bits.wrapping_add(1)),
                f32::from_bits(bits.wrapping_sub(1)),
            ]);
        }
    }
    out.extend((0..=u32::MAX).step_by(4099).map(f32::from_bits));
    out
}

#[test]
fn half_conversions_match_src_reduce_for_every_value() {
    // Widening: every fp16 and bf16 bit pattern. Narrowing: the sweep above; a NaN must give
    // the canonical NaN on both sides, bit for bit.
    use stragglar::reduce::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    for (brain, widen, narrow) in [
        (
            0u32,
            f16_to_f32 as fn(u16) -> f32,
            f32_to_f16 as fn(f32) -> u16,
        ),
        (1, bf16_to_f32, f32_to_bf16),
    ] {
        let floats = narrowing_sweep(widen);
        let n = bits.len().max(floats.len());
        let bits: Vec<u16> = bits.iter().copied().cycle().take(n).collect();
        let floats: Vec<f32> = floats.iter().copied().cycle().take(n).collect();
        let mut widened = vec![0f32; n];
        let mut narrowed = vec![0u16; n];
        // SAFETY: four arrays of n elements each, as the function reads and writes them.
        unsafe {
            (kernel().half)(
                brain,
                bits.as_ptr(),
                widened.as_mut_ptr(),
                floats.as_ptr(),
                narrowed.as_mut_ptr(),
                n as u64,
            )
        };
        for i in 0..n {
            assert_eq!(
                widened[i].to_bits(),
                widen(bits[i]).to_bits(),
                "brain {brain}: widening {:#06x}",
                bits[i]
            );
            assert_eq!(
                narrowed[i],
                narrow(floats[i]),
                "brain {brain}: narrowing {:#010x}",
                floats[i].to_bits()
            );
        }
        assert!(
            floats.iter().any(|f| f.is_nan()) && narrowed.contains(&0x7fff),
            "the sweep narrows NaNs"
        );
    }
}

#[test]
fn arbitrary_bit_patterns_round_like_the_host() {
    // NaNs, infinities, subnormals and wrapping integers: the C conversions and lanes against
    // src/reduce, through whole plans.
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(5, 2, 3);
    for (i, dtype) in DataType::ALL.into_iter().enumerate() {
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            check(
                &mut comm,
                &mut cache,
                &Case {
                    pieces: 1,
                    algorithm: Algorithm::Stragglar,
                    ranks: 5,
                    straggler: i % 5,
                    dtype,
                    op,
                    count: 777,
                    offset: 0,
                    in_place: false,
                    raw: true,
                    seed: 100 + i as u64,
                },
            );
        }
    }
}

#[test]
fn world_sizes_algorithms_counts_and_misaligned_buffers() {
    let mut cache = PlanCache::default();
    let mut seed = 500;
    for ranks in [2usize, 3, 5, 8] {
        let mut comm = Comm::new(ranks, 2, 2);
        // Ordered reads everywhere else; here the 5-rank calls read as soon as they may.
        comm.ordered_reads = ranks != 5;
        for algorithm in [Algorithm::Stragglar, Algorithm::Ring] {
            for count in [1usize, 7, 64, 4099] {
                for offset in [0usize, 4, 6] {
                    seed += 1;
                    let dtype = if offset % 4 == 0 {
                        DataType::F32
                    } else {
                        DataType::Bf16
                    };
                    check(
                        &mut comm,
                        &mut cache,
                        &Case {
                            pieces: 1,
                            algorithm,
                            ranks,
                            straggler: (seed as usize) % ranks,
                            dtype,
                            op: ReduceOp::Sum,
                            count,
                            offset,
                            in_place: seed % 2 == 0,
                            raw: false,
                            seed,
                        },
                    );
                }
            }
        }
    }
}

#[test]
fn pulls_of_more_than_eight_operands_fold_in_order_across_batches() {
    // 12 ranks: an early rank's pull combines 11 operands, read 8 then 3 (sg_reduce16's
    // batches); float sums are order-sensitive, so a batch folded out of order shows.
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(12, 2, 2);
    for (i, (dtype, op)) in [
        (DataType::F32, ReduceOp::Sum),
        (DataType::F16, ReduceOp::Sum),
        (DataType::Bf16, ReduceOp::Max),
        (DataType::I32, ReduceOp::Prod),
        (DataType::F64, ReduceOp::Avg),
    ]
    .into_iter()
    .enumerate()
    {
        check(
            &mut comm,
            &mut cache,
            &Case {
                pieces: 1,
                algorithm: Algorithm::Stragglar,
                ranks: 12,
                straggler: i * 5 % 12,
                dtype,
                op,
                count: 2053,
                offset: 0,
                in_place: i % 2 == 0,
                raw: false,
                seed: 7700 + i as u64,
            },
        );
    }
}

/// Pipelined StragglAR plans (chunks cut into pieces) on the emulated kernel, bit for bit
/// against the interpreter: every type and op, n = 2..8, odd counts, misaligned buffers.
#[test]
fn pipelined_plans_match_the_interpreter_bit_for_bit() {
    let mut cache = PlanCache::default();
    let mut seed = 9000;
    for (ranks, pieces) in [(2, 3), (3, 2), (4, 3), (5, 2), (8, 2), (8, 6)] {
        let shape = Shape {
            algorithm: Algorithm::Stragglar,
            ranks,
            straggler: 0,
            dtype: DataType::F32,
            pieces,
        };
        let chunks = planned(&mut cache, shape, 4099).plan.chunks.len();
        assert_eq!(chunks, (ranks - 1) * pieces, "the plan is pipelined");
        let mut comm = Comm::new(ranks, 2, 2);
        for (i, &dtype) in DataType::ALL.iter().enumerate() {
            seed += 1;
            let op = ReduceOp::ALL[(i + ranks) % ReduceOp::ALL.len()];
            let offset = if dtype.size() == 1 {
                3
            } else {
                dtype.size() * 3
            };
            check(
                &mut comm,
                &mut cache,
                &Case {
                    algorithm: Algorithm::Stragglar,
                    pieces,
                    ranks,
                    straggler: (seed as usize) % ranks,
                    dtype,
                    op,
                    count: [1usize, 77, 4099][i % 3],
                    offset,
                    in_place: seed % 2 == 0,
                    raw: false,
                    seed,
                },
            );
        }
    }
}

/// Runs a call in which `absent` never launches; returns each launched rank's status and how
/// long the call took.
fn call_with_absent_rank(
    comm: &mut Comm,
    absent: usize,
    abort_after: Option<Duration>,
) -> (Vec<u32>, Duration) {
    let mut cache = PlanCache::default();
    let ranks = comm.ranks;
    let shape = Shape {
        algorithm: Algorithm::Stragglar,
        ranks,
        straggler: absent,
        dtype: DataType::F32,
        pieces: 1,
    };
    let plan = planned(&mut cache, shape, 4096);
    let mut inputs: Vec<Aligned> = (0..ranks).map(|_| Aligned::new(4096 * 4)).collect();
    let mut outputs: Vec<Aligned> = (0..ranks).map(|_| Aligned::new(4096 * 4)).collect();
    let launched: Vec<usize> = (0..ranks).filter(|&r| r != absent).collect();
    let scales = vec![Scale::None; ranks];
    let abort_word = comm.abort.addr() as usize;
    let started = Instant::now();
    scoped(|scope| {
        if let Some(after) = abort_after {
            scope.spawn(move || {
                std::thread::sleep(after);
                // SAFETY: the abort word is a live, aligned u32 that the kernel only reads.
                unsafe { AtomicU32::from_ptr(abort_word as *mut u32) }.store(1, Ordering::Release);
            });
        }
        comm.run(
            &plan,
            ReduceOp::Sum,
            &scales,
            &mut inputs,
            &mut outputs,
            0,
            false,
            &launched,
            None,
        );
    });
    let took = started.elapsed();
    (launched.iter().map(|&r| comm.status(r)).collect(), took)
}

#[test]
fn the_abort_word_releases_every_waiting_rank() {
    let mut comm = Comm::new(4, 2, 2);
    let (statuses, took) = call_with_absent_rank(&mut comm, 2, Some(Duration::from_millis(100)));
    assert!(
        statuses
            .iter()
            .all(|&s| s == STATUS_ABORTED || s == STATUS_PEER_FAILED),
        "{statuses:?}"
    );
    assert!(statuses.contains(&STATUS_ABORTED), "{statuses:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_timeout_on_one_rank_releases_the_others_through_its_failure_word() {
    // Only the timeout is set (on every rank); a rank that never arrives must not hang anyone.
    let mut comm = Comm::new(5, 2, 2);
    comm.timeout_ns = 50_000_000;
    let (statuses, took) = call_with_absent_rank(&mut comm, 4, None);
    assert!(
        statuses
            .iter()
            .all(|&s| s == STATUS_TIMEOUT || s == STATUS_PEER_FAILED),
        "{statuses:?}"
    );
    assert!(statuses.contains(&STATUS_TIMEOUT), "{statuses:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// Whichever rank failed before its launch, every peer is released through failure words,
/// ordered reads included, with no help from the timeout (long here). (A served wait watches
/// every rank's failure word, since the reader it waits for may be any rank; this test does
/// not construct that case, where a source finishes cleanly while a third rank fails mid-call:
/// every rank here depends on the failed one early.)
#[test]
fn a_failed_rank_releases_every_peer_without_the_timeout() {
    for absent in 0..5 {
        let mut comm = Comm::new(5, 2, 2);
        comm.timeout_ns = 20_000_000_000;
        comm.memory[absent].failed.bytes()[..4].copy_from_slice(&STATUS_ABORTED.to_le_bytes());
        let (statuses, took) = call_with_absent_rank(&mut comm, absent, None);
        assert!(
            statuses.iter().all(|&s| s == STATUS_PEER_FAILED),
            "rank {absent} failed: {statuses:?}"
        );
        assert!(took < Duration::from_secs(15), "rank {absent}: {took:?}");
    }
}

#[test]
fn a_corrupt_plan_is_refused_and_its_peers_give_up() {
    let mut comm = Comm::new(3, 2, 2);
    comm.timeout_ns = 2_000_000_000;
    let mut cache = PlanCache::default();
    let shape = Shape {
        algorithm: Algorithm::Stragglar,
        ranks: 3,
        straggler: 0,
        dtype: DataType::I32,
        pieces: 1,
    };
    let plan = planned(&mut cache, shape, 100);
    let mut inputs: Vec<Aligned> = (0..3).map(|_| Aligned::new(400)).collect();
    let mut outputs: Vec<Aligned> = (0..3).map(|_| Aligned::new(400)).collect();
    comm.run(
        &plan,
        ReduceOp::Sum,
        &[Scale::None; 3],
        &mut inputs,
        &mut outputs,
        0,
        false,
        &[0, 1, 2],
        Some(1),
    );
    assert_eq!(comm.status(1), STATUS_BAD_PLAN);
    for r in [0, 2] {
        assert!(
            matches!(comm.status(r), STATUS_PEER_FAILED | STATUS_TIMEOUT),
            "rank {r}: {}",
            comm.status(r)
        );
    }
}

#[test]
fn many_calls_alternate_parities_and_move_the_straggler() {
    // Consecutive calls reuse the two parities; the straggler (so the plan) changes between
    // calls with no host synchronisation but the stream order of each rank.
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(6, 2, 2);
    for call in 0..12u64 {
        check(
            &mut comm,
            &mut cache,
            &Case {
                pieces: 1,
                algorithm: Algorithm::Stragglar,
                ranks: 6,
                straggler: (call * 5 % 6) as usize,
                dtype: DataType::F16,
                op: ReduceOp::Avg,
                count: 3000 + call as usize,
                offset: 0,
                in_place: call % 3 == 0,
                raw: false,
                seed: 900 + call,
            },
        );
    }
    assert_eq!(comm.epoch(0), 12);
}

/// Runs `calls` calls on `ranks` ranks with reads ordered or not, each rank running its calls
/// back to back, ordered only by its own "stream": a fast rank starts call e+1 (writing the
/// other parity) while slow ones still read call e. `ring(call)` says which calls run Ring
/// (the others StragglAR, the straggler moving every call); every type and op take turns.
/// The two-parity argument says no value is overwritten while a peer may read it: every call's
/// output must be its plan's, bit for bit, on every rank.
fn run_ahead(
    ranks: usize,
    threads: u32,
    calls: usize,
    ordered_reads: bool,
    ring: fn(usize) -> bool,
) {
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(ranks, 2, threads);
    comm.ordered_reads = ordered_reads;
    let mut prepared = Vec::new();
    for call in 0..calls {
        let dtype = DataType::ALL[call % DataType::ALL.len()];
        let op = ReduceOp::ALL[call % ReduceOp::ALL.len()];
        let shape = Shape {
            algorithm: if ring(call) {
                Algorithm::Ring
            } else {
                Algorithm::Stragglar
            },
            ranks,
            straggler: call * 3 % ranks,
            dtype,
            pieces: 1,
        };
        let count = 2000 + 37 * call;
        let plan = planned(&mut cache, shape, count);
        let data: Vec<Vec<u8>> = (0..ranks)
            .map(|r| input(dtype, op, r, count, 7000 + call as u64, false))
            .collect();
        let scales = scales(dtype, op, ranks);
        let expected = simulate(&plan.plan, op, &data, &scales);
        let inputs: Vec<Aligned> = data
            .iter()
            .map(|d| {
                let mut a = Aligned::new(d.len());
                a.bytes()[..d.len()].copy_from_slice(d);
                a
            })
            .collect();
        let outputs: Vec<Aligned> = (0..ranks).map(|_| Aligned::new(count * 8)).collect();
        let (blobs, launches) = comm.prepare(&plan, op, &scales, &inputs, &outputs, 0, false, None);
        prepared.push((
            blobs,
            launches,
            inputs,
            outputs,
            expected,
            count * dtype.size(),
        ));
    }
    let k = kernel();
    scoped(|scope| {
        for rank in 0..ranks {
            let prepared = &prepared;
            let (blocks, threads) = (comm.grid(), comm.threads);
            scope.spawn(move || {
                for (call, (_, launches, _, _, _, _)) in prepared.iter().enumerate() {
                    // Stagger the ranks differently on every call.
                    if (rank + call) % 3 == 0 {
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    scoped(|blocks_scope| {
                        for block in 0..blocks {
                            let launch = &launches[rank];
                            blocks_scope.spawn(move || emulate_block(k, launch, block, threads));
                        }
                    });
                }
            });
        }
    });
    let label = format!("{ranks} ranks, ordered reads {ordered_reads}");
    for rank in 0..ranks {
        assert_eq!(comm.status(rank), STATUS_OK, "{label}: rank {rank}");
        assert_eq!(comm.epoch(rank), calls as u64, "{label}: rank {rank}");
    }
    for (call, (_, _, _, outputs, expected, bytes)) in prepared.iter_mut().enumerate() {
        for rank in 0..ranks {
            assert!(
                outputs[rank].bytes()[..*bytes] == expected[rank][..],
                "{label}: call {call} rank {rank}"
            );
        }
    }
}

#[test]
fn ranks_run_ahead_without_a_barrier_between_calls() {
    run_ahead(5, 2, 10, true, |call| call % 4 == 3);
}

#[test]
fn ranks_run_ahead_at_two_to_four_ranks_with_reads_ordered_or_not() {
    for ranks in 2..=4 {
        for ordered_reads in [true, false] {
            // Three threads: plan block 0 has two for the plan beside its arrival thread, and a
            // read's flag and turn are waited for by two threads.
            run_ahead(ranks, 3, 8, ordered_reads, |call| call % 3 == 1);
        }
    }
}

#[test]
fn ranks_run_ahead_on_ring_alone() {
    for ordered_reads in [true, false] {
        run_ahead(4, 2, 8, ordered_reads, |_| true);
    }
}

/// A StragglAR f32 sum of `count` elements out of place: the arrival-record tests' call.
fn f32_sum(ranks: usize, straggler: usize, count: usize, seed: u64) -> Case {
    Case {
        pieces: 1,
        algorithm: Algorithm::Stragglar,
        ranks,
        straggler,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        count,
        offset: 0,
        in_place: false,
        raw: false,
        seed,
    }
}

#[test]
fn arrival_records_name_the_late_rank_identically_on_every_rank() {
    // Calls alternate between the AllReduce kernel (its arrival thread runs beside the plan)
    // and the ticket kernel (a call the policy sends to NCCL, whose work takes 20 ms once
    // every rank arrived); one rank, a different one each call, launches 30 ms after the
    // others. Every rank's ring must hold the same record of every call: the late rank, a
    // lead of about the delay, and the post-arrival time, each measured on one clock.
    let ranks = 5;
    let calls = 10u64;
    let late_of = |call: u64| (call * 3 % 5) as usize;
    let delay = Duration::from_millis(30);
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(ranks, 2, 2);
    comm.nccl_time = Duration::from_millis(20);
    let everyone: Vec<usize> = (0..ranks).collect();
    for call in 0..calls {
        comm.late = Some((late_of(call), delay));
        if call % 2 == 0 {
            let case = f32_sum(ranks, (call % 5) as usize, 1500 + call as usize, 40 + call);
            check(&mut comm, &mut cache, &case);
        } else {
            comm.tickets(&everyone);
        }
    }
    // The next two ticketed launches copy the last call's record and its post-arrival time.
    comm.tickets(&everyone);
    comm.tickets(&everyone);
    for call in 0..calls {
        let (last, lead, post) = comm.agreed_record(call);
        assert_eq!(last as usize, late_of(call), "call {call}");
        let lead = Duration::from_nanos(lead as u64);
        assert!(
            lead >= delay / 2 && lead < Duration::from_secs(20),
            "call {call}: {lead:?}"
        );
        assert_ne!(post, POST_UNMEASURED, "call {call}");
        let post = Duration::from_nanos(post as u64);
        let least = match call % 2 {
            0 => Duration::from_nanos(1),
            _ => comm.nccl_time,
        };
        assert!(
            post >= least && post < Duration::from_secs(20),
            "call {call}: {post:?}"
        );
    }
    for r in 0..ranks {
        assert_eq!(comm.status(r), STATUS_OK);
    }
}

#[test]
fn many_ticketed_calls_wrap_the_ring_and_reuse_the_board() {
    // More calls than the ring has entries, and each board slot reused many times.
    let ranks = 4;
    let calls = RING_ENTRIES as u64 + 9;
    let mut comm = Comm::new(ranks, 1, 1);
    let everyone: Vec<usize> = (0..ranks).collect();
    for call in 0..calls {
        comm.late = Some(((call % 4) as usize, Duration::from_millis(2)));
        comm.tickets(&everyone);
    }
    for call in 0..calls - 2 {
        // Records 0..calls-2 were collected (each end kernel collects the record of the call
        // two before it); entry k was last written by the newest of them.
        let held = call + RING_ENTRIES as u64 + 3 > calls;
        for r in 0..ranks {
            let record = comm.record(r, call);
            if held {
                assert_eq!(
                    record.map(|(last, _)| last as u64),
                    Some(call % 4),
                    "call {call}"
                );
            } else {
                assert_eq!(record, None, "call {call}'s entry was reused");
            }
        }
    }
}

#[test]
fn a_call_whose_end_was_never_noted_is_published_unmeasured_on_every_rank() {
    // A call NCCL ran whose end kernel the host never queued (a nonblocking launch whose
    // success the application never read): its last arrival cannot time it, and every rank
    // must read it as unmeasured rather than wait for it or read a stale time. The calls
    // around it keep their times.
    let ranks = 4;
    let mut comm = Comm::new(ranks, 1, 1);
    comm.nccl_time = Duration::from_millis(5);
    let everyone: Vec<usize> = (0..ranks).collect();
    for call in 0..6u64 {
        comm.late = Some(((call % 4) as usize, Duration::from_millis(2)));
        comm.skip_end = call == 2;
        comm.tickets(&everyone);
    }
    for call in 0..4u64 {
        let posts: Vec<Option<u32>> = (0..ranks).map(|r| comm.post(r, call)).collect();
        assert!(
            posts.iter().all(|p| *p == posts[0]),
            "call {call}: {posts:?}"
        );
        match call {
            2 => assert_eq!(posts[0], Some(POST_UNMEASURED)),
            _ => assert!(
                posts[0].is_some_and(|ns| ns != POST_UNMEASURED && ns >= 5_000_000),
                "call {call}: {posts:?}"
            ),
        }
    }
    for r in 0..ranks {
        assert_eq!(comm.status(r), STATUS_OK);
    }
}

#[test]
fn calls_nccl_runs_name_their_last_rank_and_the_sample_measures_their_lead() {
    // 60 calls NCCL runs, each with one rank 10 ms late (a different one each call), end kernels
    // only on the library's sample: every call's record names its late rank alike on every
    // rank; the measured calls' leads (span minus post) are about the delay and their posts
    // NCCL's time; the others carry no lead and no post, and nobody waited for them. A lead
    // holds the OS's lateness in running one rank's end kernel, so a rare call may read short:
    // at most one lead may be under half the delay, and every lead must be sane.
    let ranks = 4;
    let calls = 60u64;
    let delay = Duration::from_millis(10);
    let mut comm = Comm::new(ranks, 1, 1);
    comm.sampled = true;
    comm.nccl_time = Duration::from_millis(3);
    let everyone: Vec<usize> = (0..ranks).collect();
    let late_of = |call: u64| (call * 7 % 4) as usize;
    for call in 0..calls {
        comm.late = Some((late_of(call), delay));
        comm.tickets(&everyone);
    }
    let collected = comm.collected.get();
    assert!(
        collected + COLLECT_BY + 1 >= calls,
        "{collected} of {calls}"
    );
    let mut leads = Vec::new();
    for call in 0..collected {
        let (last, lead, post) = comm.agreed_record(call);
        assert_eq!(last as usize, late_of(call), "call {call}");
        if post == POST_UNMEASURED {
            assert_eq!(lead, LEAD_FROM_SPANS, "call {call}: a lead without a post");
            continue;
        }
        let lead = Duration::from_nanos(lead.into());
        assert!(lead < Duration::from_secs(20), "call {call}: {lead:?}");
        assert!(
            Duration::from_nanos(post.into()) >= comm.nccl_time,
            "call {call}: {post}"
        );
        leads.push(lead);
    }
    let measured = leads.len();
    assert!(
        (3..collected as usize / 2).contains(&measured),
        "{measured} of {collected} measured"
    );
    let short = leads.iter().filter(|&&lead| lead < delay / 2).count();
    assert!(short <= 1, "leads {leads:?}");
    for r in 0..ranks {
        assert_eq!(comm.status(r), STATUS_OK);
    }
}

/// Runs ticketed calls 0..=2 of ranks 0..=2 of 4 (rank 3 never arrives), the last one's end
/// kernels run anyway (their collection waits for call 0's record) while another thread sets the
/// u32 at `word` to `value` after 50 ms; returns the three statuses, after asserting that the
/// calls ended and that no ticket kernel waited.
fn collections_released_by(comm: &mut Comm, word: u64, value: u32) -> Vec<u32> {
    let word = word as usize;
    comm.tickets(&[0, 1, 2]);
    comm.tickets(&[0, 1, 2]);
    for r in 0..3 {
        assert_eq!(comm.status(r), STATUS_OK, "a ticket kernel waited");
    }
    let started = Instant::now();
    scoped(|scope| {
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: an aligned u32 of the Comm (abort or failure word) the kernels only read.
            unsafe { AtomicU32::from_ptr(word as *mut u32) }.store(value, Ordering::Release);
        });
        comm.end_without_all = true;
        comm.tickets(&[0, 1, 2]);
    });
    assert!(started.elapsed() < Duration::from_secs(30));
    (0..3).map(|r| comm.status(r)).collect()
}

#[test]
fn a_collection_waiting_for_an_absent_rank_is_released_by_the_abort_word() {
    // Rank 3 never arrives: the ticket kernels return at once (they wait for nobody), and the
    // end kernels' collection of call 0's record waits for its last arrival until the abort
    // word is raised.
    let mut comm = Comm::new(4, 1, 1);
    let abort = comm.abort.addr();
    let statuses = collections_released_by(&mut comm, abort, 1);
    assert_eq!(statuses, [STATUS_ABORTED; 3]);
}

#[test]
fn a_collection_waiting_for_a_rank_that_failed_on_its_host_is_released_by_its_failure_word() {
    // Rank 3 failed before its launch (as the library's `mark_failed` reports it) and never
    // takes its ticket; no abort, no deadline: its failure word alone releases the collections
    // waiting for its record, which report a peer failure.
    let mut comm = Comm::new(4, 1, 1);
    comm.timeout_ns = 0;
    let failed = comm.memory[3].failed.addr();
    let statuses = collections_released_by(&mut comm, failed, STATUS_ABORTED);
    assert_eq!(statuses, [STATUS_PEER_FAILED; 3]);
}

#[test]
fn every_rank_decides_alike_from_its_own_ring() {
    // The GPU engine's loop, with emulated GPUs: each rank's tracker reads due records from
    // its own ring only, decides, and the call runs the AllReduce kernel (StragglAR with the
    // designated straggler) or the ticket kernel (the call NCCL would run). Rank 3 is late in
    // most calls, a random rank in the others: every rank must choose alike on every call, and
    // StragglAR must take over once rank 3 is designated.
    use stragglar::detect::policy::AlgoMode;
    use stragglar::detect::{ArrivalRecord, Choice, Tracker};
    let ranks = 4;
    let mut trackers: Vec<Tracker> = (0..ranks)
        .map(|_| {
            let policy = slow_link_policy(ranks, AlgoMode::Auto);
            // A record is collected by the launch two calls after its own, which runs once
            // the call after it is decided.
            Tracker::new(policy, ranks, 3)
        })
        .collect();
    let mut comm = Comm::new(ranks, 1, 2);
    let mut cache = PlanCache::default();
    let everyone: Vec<usize> = (0..ranks).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut on_stragglar = Vec::new();
    for call in 0..70u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let late = if x % 6 == 0 { (x / 6 % 4) as usize } else { 3 };
        comm.late = Some((late, Duration::from_millis(8)));
        let choices: Vec<Choice> = trackers
            .iter_mut()
            .enumerate()
            .map(|(r, t)| {
                while let Some(k) = t.due() {
                    let (last, lead) = comm.record(r, k).expect("a due record is in the ring");
                    t.feed(ArrivalRecord {
                        last_rank: last as usize,
                        lead_ns: (lead != LEAD_FROM_SPANS).then_some(lead.into()),
                    });
                }
                t.decide(64 << 10)
            })
            .collect();
        assert!(
            choices.iter().all(|c| *c == choices[0]),
            "call {call}: {choices:?}"
        );
        match choices[0] {
            Choice::Stragglar { straggler } => {
                on_stragglar.push(call);
                check(
                    &mut comm,
                    &mut cache,
                    &f32_sum(ranks, straggler, 16 << 10, call),
                );
            }
            Choice::Baseline => comm.tickets(&everyone),
        }
    }
    let table = trackers[0].table(&[]);
    assert!(trackers.iter().all(|t| t.table(&[]) == table));
    assert!(
        on_stragglar.len() > 10 && on_stragglar.last() == Some(&69),
        "StragglAR calls {on_stragglar:?}\n{table}"
    );
    assert!(table.contains("straggler 3"), "{table}");
}

#[test]
fn the_bandwidth_probe_folds_with_the_same_element_code() {
    use stragglar::reduce::combine;
    let k = kernel();
    for (dtype, op, operands) in [
        (DataType::F32, ReduceOp::Sum, 1usize),
        (DataType::Bf16, ReduceOp::Sum, 2),
        (DataType::I64, ReduceOp::Max, 3),
        (DataType::F16, ReduceOp::Prod, 8),
    ] {
        let count = 10_007;
        let bytes = count * dtype.size();
        let mut inputs: Vec<Aligned> = (0..operands).map(|_| Aligned::new(bytes)).collect();
        let data: Vec<Vec<u8>> = (0..operands)
            .map(|i| input(dtype, op, i, count, 31, false))
            .collect();
        for (a, d) in inputs.iter_mut().zip(&data) {
            a.bytes()[..bytes].copy_from_slice(d);
        }
        let mut output = Aligned::new(bytes);
        let mut args = RawApply {
            output: output.addr(),
            bytes: bytes as u64,
            operand_count: operands as u32,
            op: op_code(op),
            datatype: dtype.nccl_code(),
            ..Default::default()
        };
        for (slot, a) in args.operands.iter_mut().zip(&inputs) {
            *slot = a.addr();
        }
        let (blocks, threads) = (3u32, 2u32);
        scoped(|scope| {
            for block in 0..blocks {
                let args = &args;
                scope.spawn(move || {
                    let mut barrier = std::mem::MaybeUninit::<libc::pthread_barrier_t>::uninit();
                    // SAFETY: a barrier we own, for `threads` participants.
                    unsafe {
                        libc::pthread_barrier_init(barrier.as_mut_ptr(), std::ptr::null(), threads)
                    };
                    let scratch = Aligned::new(k.scratch_bytes);
                    let (b, s) = (barrier.as_mut_ptr() as usize, scratch.addr() as usize);
                    scoped(|inner| {
                        for thread in 0..threads {
                            // SAFETY: args, barrier and scratch outlive the threads.
                            inner.spawn(move || unsafe {
                                (k.apply)(
                                    args,
                                    block,
                                    blocks,
                                    thread,
                                    threads,
                                    b as *mut _,
                                    s as *mut c_void,
                                )
                            });
                        }
                    });
                    // SAFETY: every participant has left the barrier.
                    unsafe { libc::pthread_barrier_destroy(barrier.as_mut_ptr()) };
                });
            }
        });
        let slices: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut expected = vec![0u8; bytes];
        combine(dtype, op, &slices, &mut expected);
        assert!(
            output.bytes()[..bytes] == expected[..],
            "{dtype:?} {op:?} x{operands}"
        );
    }
}

#[test]
fn the_device_rule_chooses_exactly_what_the_rust_policy_chooses() {
    // The twin that graph replays run on the GPU (cuda/stragglar_choice.h) against the one
    // rule (src/detect): random settings and detector parameters (windows from 1 to past the
    // longest, thresholds from 0 to past the window, dwells from 0), sizes and record streams
    // in which a straggler settles, moves and is interrupted by others (some outside the
    // communicator), with leads scattered around the size's break-even, so that the lead test
    // decides many calls. Every choice, and the final designation, must agree.
    use stragglar::detect::policy::{AlgoMode, StragglerMode};
    use stragglar::detect::{ArrivalRecord, Choice, Detector, DetectorConfig, Policy};
    let k = kernel();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut outcomes = [0usize; 2];
    for case in 0..300 {
        let ranks = 1 + (next() % 10) as usize;
        let algo = [AlgoMode::Auto, AlgoMode::Stragglar, AlgoMode::Baseline][match next() % 4 {
            0 => 1,
            1 => 2,
            _ => 0,
        }];
        let straggler = match next() % 5 {
            0 => StragglerMode::Fixed((next() % (ranks as u64 + 2)) as usize),
            1 => StragglerMode::Off,
            _ => StragglerMode::Auto,
        };
        let link = stragglar::schedule::model::Link {
            alpha: 1e-6 * (1 + next() % 20) as f64,
            bandwidth: 1e9 * (1 + next() % 400) as f64,
        };
        let policy = Policy::new(ranks, algo, straggler, link);
        let bytes = 1usize << (10 + next() % 20);
        let fractions = [0.0, 0.3, 0.5, 0.75, 0.9, 1.0, 1.2];
        let config = if case % 3 == 0 {
            DetectorConfig::default()
        } else {
            DetectorConfig {
                window: 1 + (next() % 80) as usize,
                on_fraction: fractions[(next() % 7) as usize],
                off_fraction: fractions[(next() % 7) as usize],
                min_dwell: next() % 40,
            }
        };
        let rule = RawRule::with_detector(&policy, config, bytes);
        let break_even = policy
            .break_even_ns(bytes)
            .unwrap_or(1_000_000)
            .min(u32::MAX as u64 / 2);
        let calls = 400;
        let mut home = (next() % ranks as u64) as u32;
        let (mut last, mut lead) = (Vec::new(), Vec::new());
        for _ in 0..calls {
            if next() % 150 == 0 {
                home = (next() % ranks as u64) as u32;
            }
            last.push(match next() % 10 {
                0..=6 => home,
                7 | 8 => (next() % ranks as u64) as u32,
                _ => (next() % (ranks as u64 + 3)) as u32,
            });
            let l = match next() % 8 {
                0 => break_even,
                1 => break_even.saturating_sub(1),
                _ => break_even / 2 + next() % (break_even + 1),
            };
            lead.push(l.min(u32::MAX as u64) as u32);
        }
        // SAFETY: RawDetector is plain integers; all zeroes is its empty state.
        let mut device: RawDetector = unsafe { std::mem::zeroed() };
        let mut choices = vec![0u32; calls];
        // SAFETY: the arrays hold `calls` entries each; the rule and detector are live.
        unsafe {
            (k.rule)(
                &rule,
                &mut device,
                last.as_ptr(),
                lead.as_ptr(),
                calls as u32,
                choices.as_mut_ptr(),
            )
        };
        let mut host = Detector::new(ranks, config);
        for c in 0..calls {
            let expected = match policy.choose(&host, None, bytes) {
                Choice::Stragglar { straggler } => straggler as u32,
                Choice::Baseline => ranks as u32,
            };
            assert_eq!(
                choices[c], expected,
                "case {case} call {c}: {ranks} ranks, {algo:?}, {straggler:?}, {bytes} B, {config:?}"
            );
            outcomes[usize::from(expected != ranks as u32)] += 1;
            host.observe(ArrivalRecord {
                last_rank: last[c] as usize,
                lead_ns: Some(lead[c].into()),
            });
        }
        assert_eq!(
            device.designated,
            host.designated().map_or(0, |r| r as u32 + 1),
            "case {case}"
        );
    }
    assert!(outcomes.iter().all(|&n| n > 10_000), "{outcomes:?}");
}

/// `count` f32s of `rank` whose sums round differently in different orders.
fn uneven_floats(rank: usize, count: usize, seed: u64) -> Vec<u8> {
    noise(seed ^ (rank as u64) << 24, count * 2)
        .chunks(2)
        .flat_map(|b| {
            let v = (b[0] as f32 - 128.0) / 7.0 + b[1] as f32 * 1e-5;
            v.to_le_bytes()
        })
        .collect()
}

/// A policy of `algo` (the straggler detected) over links slow enough (20 us and 20 MB/s per
/// transfer) that StragglAR wins the tests' sizes once a rank is late by a few milliseconds.
fn slow_link_policy(
    ranks: usize,
    algo: stragglar::detect::policy::AlgoMode,
) -> stragglar::detect::Policy {
    let link = stragglar::schedule::model::Link {
        alpha: 20e-6,
        bandwidth: 20e6,
    };
    stragglar::detect::Policy::new(
        ranks,
        algo,
        stragglar::detect::policy::StragglerMode::Auto,
        link,
    )
}

/// One call captured into a graph on every rank: its launches (replayed unchanged), the plan
/// blobs and tables they point to, its buffers, and each choice's expected outputs.
struct Captured {
    bytes: usize,
    launches: Vec<RawLaunch>,
    _blobs: Vec<Vec<Vec<u64>>>,
    _tables: Vec<Vec<u64>>,
    _inputs: Vec<Aligned>,
    outputs: Vec<Aligned>,
    /// `expected[choice][rank]`: the output of plan `choice` (straggler, or Ring at `ranks`).
    expected: Vec<Vec<Vec<u8>>>,
}

impl Captured {
    /// Captures an f32 sum of `count` elements on `comm` under `policy` with a detector of
    /// `config`.
    fn new(
        comm: &Comm,
        cache: &mut PlanCache,
        policy: &stragglar::detect::Policy,
        config: stragglar::detect::DetectorConfig,
        count: usize,
    ) -> Captured {
        let ranks = comm.ranks;
        let bytes = count * 4;
        let plans: Vec<Planned> = (0..=ranks)
            .map(|choice| planned(cache, Shape::of_choice(ranks, choice, DataType::F32), count))
            .collect();
        let blobs: Vec<Vec<Vec<u64>>> = (0..ranks)
            .map(|r| plans.iter().map(|p| blob_words(&p.lowered, r)).collect())
            .collect();
        let tables: Vec<Vec<u64>> = blobs
            .iter()
            .map(|own| own.iter().map(|b| b.as_ptr() as u64).collect())
            .collect();
        let data: Vec<Vec<u8>> = (0..ranks)
            .map(|r| uneven_floats(r, count, count as u64))
            .collect();
        let expected: Vec<Vec<Vec<u8>>> = plans
            .iter()
            .map(|p| simulate(&p.plan, ReduceOp::Sum, &data, &vec![Scale::None; ranks]))
            .collect();
        assert_ne!(expected[2], expected[ranks], "the plans' sums must differ");
        let inputs: Vec<Aligned> = data
            .iter()
            .map(|d| {
                let mut a = Aligned::new(bytes);
                a.bytes()[..bytes].copy_from_slice(d);
                a
            })
            .collect();
        let outputs: Vec<Aligned> = (0..ranks).map(|_| Aligned::new(bytes)).collect();
        let rule = RawRule::with_detector(policy, config, bytes);
        let launches = comm.graph_launches(count, &tables, rule, &inputs, &outputs);
        Captured {
            bytes,
            launches,
            _blobs: blobs,
            _tables: tables,
            _inputs: inputs,
            outputs,
            expected,
        }
    }
}

/// Checks every rank after graph call `replay` ran `captured`: no failure, the call counted,
/// `choice` made on the GPU, and that choice's output bit for bit.
fn check_replay(comm: &mut Comm, captured: &mut Captured, replay: u64, choice: usize) {
    let bytes = captured.bytes;
    for r in 0..comm.ranks {
        let state = comm.graph_state(r);
        assert_eq!(comm.status(r), STATUS_OK, "replay {replay} rank {r}");
        assert_eq!(state.calls, replay + 1, "replay {replay} rank {r}");
        assert_eq!(
            state.last_choice as usize,
            choice + 1,
            "replay {replay} ({bytes} B) rank {r}: the device chose otherwise"
        );
        assert!(
            captured.outputs[r].bytes()[..bytes] == captured.expected[choice][r][..],
            "replay {replay} rank {r}: not the output of choice {choice}"
        );
    }
}

/// The record of graph call `call`, which the next replay copied: tagged with the call, and
/// the same on every rank.
fn graph_record(comm: &Comm, call: u64) -> stragglar::detect::ArrivalRecord {
    let at = call as usize % RING_ENTRIES as usize;
    let entry = comm.graph_state(0).ring[at];
    let (last, lead) = untag(entry, call).unwrap_or_else(|| panic!("call {call}: untagged"));
    for r in 1..comm.ranks {
        assert_eq!(comm.graph_state(r).ring[at], entry, "call {call} rank {r}");
    }
    stragglar::detect::ArrivalRecord {
        last_rank: last as usize,
        lead_ns: Some(lead.into()),
    }
}

/// A ring entry's (last rank, lead ns) when both its words carry call `call`'s tag (`sg_tag`
/// in cuda/stragglar_arrival.h).
fn untag(entry: RawRingEntry, call: u64) -> Option<(u32, u32)> {
    // The post word comes a call later and is checked apart (`Comm::post`).
    let tag = ((call % 0xffff_ffff) + 1) << 32;
    let tagged = |word: u64| word >> 32 << 32 == tag;
    (tagged(entry.last) && tagged(entry.lead)).then_some((entry.last as u32, entry.lead as u32))
}

#[test]
fn graph_replays_find_the_late_rank_and_choose_their_plan_on_the_device() {
    // Two calls of different size classes captured into graphs and replayed in a random order,
    // with the same launch arguments every time, on 4 emulated GPUs, eager calls in between.
    // Rank 2 is late in most replays, a random rank in the others. No host decides anything:
    // each replay numbers itself, records its arrival and feeds the device detector of the
    // previous graph call's class. Every rank must pick the same plan on every replay, the one
    // the Rust policy picks from the records of the graph calls before the previous one (per
    // class), StragglAR with rank 2 must take over in both classes, and every output must be
    // that plan's, bit for bit.
    use stragglar::detect::policy::AlgoMode;
    use stragglar::detect::{size_class, Choice, Detector, DetectorConfig};
    let ranks = 4;
    let policy = slow_link_policy(ranks, AlgoMode::Auto);
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(ranks, 2, 2);
    let config = DetectorConfig::default();
    let mut captured = [
        Captured::new(&comm, &mut cache, &policy, config, 4096),
        Captured::new(&comm, &mut cache, &policy, config, 300),
    ];
    assert_ne!(size_class(captured[0].bytes), size_class(captured[1].bytes));
    let mut detectors = [0, 1].map(|_| Detector::new(ranks, DetectorConfig::default()));
    let mut x = 0x5851_f42d_4c95_7f2du64;
    let mut random = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let everyone: Vec<usize> = (0..ranks).collect();
    let mut classes = Vec::new();
    let mut last_stragglar = [false; 2];
    let mut on_stragglar = 0;
    let replays = 96u64;
    for replay in 0..replays {
        if replay % 9 == 4 {
            // An eager call between replays: its own board and numbering, the shared epoch.
            let case = f32_sum(ranks, 1, 2000, replay);
            check(&mut comm, &mut cache, &case);
        }
        let which = (random() % 2) as usize;
        let late = if random() % 6 == 0 {
            (random() % 4) as usize
        } else {
            2
        };
        comm.late = Some((late, Duration::from_millis(8)));
        let bytes = captured[which].bytes;
        let choice = match policy.choose(&detectors[which], None, bytes) {
            Choice::Stragglar { straggler } => straggler,
            Choice::Baseline => ranks,
        };
        on_stragglar += usize::from(choice < ranks);
        last_stragglar[which] = choice == 2;
        classes.push(which);
        // Odd replays: the late rank's arrival thread writes the verdict of its class's next
        // call before its data blocks read this call's (the other half).
        comm.replay(&captured[which].launches, &everyone, replay % 2 == 1);
        check_replay(&mut comm, &mut captured[which], replay, choice);
        if replay > 0 {
            detectors[classes[replay as usize - 1]].observe(graph_record(&comm, replay - 1));
        }
    }
    let state = comm.graph_state(0);
    assert_eq!(state.on_stragglar + state.on_baseline, replays);
    assert_eq!(state.on_stragglar as usize, on_stragglar);
    assert_eq!(
        last_stragglar, [true; 2],
        "StragglAR with rank 2 in both classes"
    );
}

#[test]
fn graph_replays_run_ahead_without_a_barrier_between_them() {
    // Each rank replays its captured call back to back, ordered only by its own stream: a fast
    // rank's replay r+1 numbers itself, takes its ticket and chooses its plan from the device's
    // state while slow ranks still run replay r. Rank 2 starts most replays last, so the
    // device detector finds it and StragglAR replays run beside Ring ones (at 4 and 5 ranks:
    // the policy keeps fewer on the baseline). Every rank must end
    // with the same count and the same last choice, and that choice's output bit for bit.
    use stragglar::detect::policy::AlgoMode;
    use stragglar::detect::DetectorConfig;
    let replays = 64u64;
    for ranks in [4, 5] {
        let policy = slow_link_policy(ranks, AlgoMode::Auto);
        let mut cache = PlanCache::default();
        let mut comm = Comm::new(ranks, 2, 3);
        let mut captured =
            Captured::new(&comm, &mut cache, &policy, DetectorConfig::default(), 4096);
        let k = kernel();
        let (grid, threads) = (comm.blocks, comm.threads);
        let board = comm.graph_board();
        scoped(|scope| {
            for (rank, launch) in captured.launches.iter().enumerate() {
                scope.spawn(move || {
                    for replay in 0..replays {
                        if rank == 2 && replay % 5 != 0 {
                            // Last for sure, however loaded the machine (TSan is slow).
                            await_tickets(
                                board,
                                ranks,
                                replay,
                                ranks - 1,
                                Duration::from_millis(2),
                            );
                        } else if (rank as u64 + replay) % 4 == 0 {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        scoped(|blocks| {
                            for block in 0..grid {
                                blocks.spawn(move || emulate_block(k, launch, block, threads));
                            }
                        });
                    }
                });
            }
        });
        let last = comm.graph_state(0);
        let choice = last.last_choice as usize - 1;
        assert!(choice <= ranks, "{ranks} ranks: choice {choice}");
        assert_eq!(last.on_stragglar + last.on_baseline, replays);
        assert!(
            last.on_stragglar > 0 && last.on_baseline > 0,
            "{ranks} ranks: {} StragglAR and {} Ring replays: both must run",
            last.on_stragglar,
            last.on_baseline
        );
        for r in 0..ranks {
            let state = comm.graph_state(r);
            assert_eq!(comm.status(r), STATUS_OK, "{ranks} ranks: rank {r}");
            assert_eq!(state.calls, replays, "{ranks} ranks: rank {r}");
            assert_eq!(
                state.last_choice, last.last_choice,
                "{ranks} ranks: rank {r}"
            );
            assert_eq!(
                state.on_stragglar, last.on_stragglar,
                "{ranks} ranks: rank {r}"
            );
            let bytes = captured.bytes;
            assert!(
                captured.outputs[r].bytes()[..bytes] == captured.expected[choice][r][..],
                "{ranks} ranks: rank {r}: not the output of choice {choice}"
            );
        }
    }
}

/// The post-arrival word of graph call `call` (ns, or `POST_UNMEASURED`), which the replay two
/// calls later copied: tagged with the call, and the same on every rank.
fn graph_post(comm: &Comm, call: u64) -> u32 {
    let at = call as usize % RING_ENTRIES as usize;
    let post = comm.graph_state(0).ring[at].post;
    assert_eq!(
        post >> 32,
        (call % 0xffff_ffff) + 1,
        "call {call}: untagged"
    );
    for r in 1..comm.ranks {
        assert_eq!(
            comm.graph_state(r).ring[at].post,
            post,
            "call {call} rank {r}"
        );
    }
    post as u32
}

#[test]
fn graph_replays_choose_on_measured_times_exactly_as_the_rust_policy_does() {
    // As above, with the rule the library captures: measuring. Each replay also feeds the
    // post-arrival time of the graph call two before it to that call's class, and the choice
    // follows the measured times once both algorithms have recent ones, exploring two calls
    // in 64 of a class. The Rust policy, fed the same records and times from the device's
    // ring at the same calls (`Tracker`'s rules: a call after a switch is not kept, samples
    // dated by the class's calls, older than 128 of them ignored), must pick the same plan on
    // every replay, and every rank the same. Class 0 gets most calls, so that its samples age.
    use stragglar::detect::estimate::ClassTimes;
    use stragglar::detect::policy::AlgoMode;
    use stragglar::detect::{size_class, Choice, Detector, DetectorConfig};
    let ranks = 4;
    let policy = slow_link_policy(ranks, AlgoMode::Auto);
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(ranks, 2, 2);
    let config = DetectorConfig::default();
    let mut captured = [
        Captured::new(&comm, &mut cache, &policy, config, 4096),
        Captured::new(&comm, &mut cache, &policy, config, 300),
    ];
    for c in &mut captured {
        for launch in &mut c.launches {
            launch.rule = launch.rule.measuring();
        }
    }
    assert_ne!(size_class(captured[0].bytes), size_class(captured[1].bytes));
    let mut detectors = [0, 1].map(|_| Detector::new(ranks, config));
    let mut times = [ClassTimes::default(), ClassTimes::default()];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let everyone: Vec<usize> = (0..ranks).collect();
    // Per replay: its class, whether it ran StragglAR, whether its class switched.
    let mut history: Vec<(usize, bool, bool)> = Vec::new();
    let (mut explored, mut measured) = ([0u32; 2], [false; 2]);
    let replays = 200u64;
    for replay in 0..replays {
        let which = usize::from(random() % 10 >= 7);
        let late = if random() % 5 == 0 {
            (random() % 4) as usize
        } else {
            2
        };
        comm.late = Some((late, Duration::from_millis(4)));
        let bytes = captured[which].bytes;
        let choice = match policy.choose(&detectors[which], Some(&times[which]), bytes) {
            Choice::Stragglar { straggler } => straggler,
            Choice::Baseline => ranks,
        };
        explored[which] += u32::from(times[which].explores_next());
        measured[which] |= times[which].stragglar_wins().is_some();
        let stragglar = choice < ranks;
        let after_switch = times[which]
            .last_stragglar()
            .is_some_and(|last| last != stragglar);
        times[which].count(stragglar);
        history.push((which, stragglar, after_switch));
        comm.replay(&captured[which].launches, &everyone, replay % 2 == 1);
        check_replay(&mut comm, &mut captured[which], replay, choice);
        if replay > 0 {
            let (class, ..) = history[replay as usize - 1];
            detectors[class].observe(graph_record(&comm, replay - 1));
        }
        if replay > 1 {
            let (class, stragglar, after_switch) = history[replay as usize - 2];
            let post = graph_post(&comm, replay - 2);
            assert_ne!(post, POST_UNMEASURED, "replay {}", replay - 2);
            if !after_switch {
                times[class].add(stragglar, post as u64);
            }
        }
    }
    assert!(explored.iter().all(|&e| e >= 2), "{explored:?}");
    assert_eq!(
        measured, [true; 2],
        "both algorithms measured in both classes"
    );
    let state = comm.graph_state(0);
    let kept = |t: &ClassTimes| t.stragglar.taken() + t.baseline.taken();
    let device_kept = |class: usize| {
        let t = &state.classes[size_class(captured[class].bytes) as usize].times;
        t.stragglar.taken + t.baseline.taken
    };
    assert_eq!(
        [device_kept(0), device_kept(1)],
        [kept(&times[0]), kept(&times[1])]
    );
}

#[test]
fn the_device_graph_policy_matches_the_rust_estimator_over_thousands_of_calls() {
    // The graph state's decisions alone (no protocol, no plan), over 8000 calls of three size
    // classes, one of them rare, with scripted records and post-arrival times written into
    // the graph ring as the protocol would (record c-1 and the time of c-2 before call c),
    // some unmeasured. The Rust estimator, fed the same, must choose the same on every call:
    // samples age out of the window at every class call, explorations, switches not kept.
    // (Without a call rewriting its own class's verdict, a class's call right after another
    // of the class read a verdict whose age window was one call behind: this test fails.)
    use stragglar::detect::estimate::ClassTimes;
    use stragglar::detect::policy::AlgoMode;
    use stragglar::detect::{size_class, ArrivalRecord, Choice, Detector, DetectorConfig};
    let ranks = 4;
    let policy = slow_link_policy(ranks, AlgoMode::Auto);
    let sizes = [4096usize, 300, 70_000];
    let rules = sizes.map(|bytes| RawRule::new(&policy, bytes).measuring());
    // SAFETY: all-zero bytes are a valid RawGraphState (integers only): a fresh one.
    let mut g: Box<RawGraphState> = unsafe { Box::new(std::mem::zeroed()) };
    let mut detectors = [0; 3].map(|_| Detector::new(ranks, DetectorConfig::default()));
    let mut times: [ClassTimes; 3] = Default::default();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut random = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let tag = |call: u64| ((call % 0xffff_ffff) + 1) << 32;
    // Per call: class, ran StragglAR, followed a switch; and its record and time.
    let mut history: Vec<(usize, bool, bool)> = Vec::new();
    let mut records: Vec<(u64, u64, u64)> = Vec::new();
    let (mut on_stragglar, mut measured) = (0u32, [0u32; 3]);
    let k = kernel();
    for call in 0..8000u64 {
        let which = match random() % 20 {
            0 => 2,
            r if r < 12 => 0,
            _ => 1,
        };
        if call > 0 {
            let (last, lead, _) = records[call as usize - 1];
            let entry = &mut g.ring[(call - 1) as usize % RING_ENTRIES as usize];
            entry.last = tag(call - 1) | last;
            entry.lead = tag(call - 1) | lead;
        }
        if call > 1 {
            let (_, _, post) = records[call as usize - 2];
            g.ring[(call - 2) as usize % RING_ENTRIES as usize].post = tag(call - 2) | post;
        }
        let expected = match policy.choose(&detectors[which], Some(&times[which]), sizes[which]) {
            Choice::Stragglar { straggler } => straggler as u32,
            Choice::Baseline => ranks as u32,
        };
        measured[which] += u32::from(times[which].stragglar_wins().is_some());
        // SAFETY: a live, exclusive graph state and rule.
        let chosen = unsafe { (k.graph_call)(&mut *g, &rules[which]) };
        assert_eq!(
            chosen, expected,
            "call {call} (class of {} B)",
            sizes[which]
        );
        let stragglar = chosen < ranks as u32;
        on_stragglar += u32::from(stragglar);
        let after_switch = times[which]
            .last_stragglar()
            .is_some_and(|last| last != stragglar);
        times[which].count(stragglar);
        history.push((which, stragglar, after_switch));
        // This call's record and time, as the protocol would copy them: rank 2 late most of
        // the time; StragglAR's time around the baseline's, so the comparison goes both ways.
        let last = if random() % 5 == 0 { random() % 4 } else { 2 };
        let lead = 1_000_000 + random() % 400_000;
        let post = match random() % 40 {
            0 => u64::from(POST_UNMEASURED),
            _ if stragglar => 850_000 + random() % 250_000 + 50_000 * which as u64,
            _ => 900_000 + random() % 250_000,
        };
        records.push((last, lead, post));
        if call > 0 {
            let (class, ..) = history[call as usize - 1];
            let (last, lead, _) = records[call as usize - 1];
            detectors[class].observe(ArrivalRecord {
                last_rank: last as usize,
                lead_ns: Some(lead),
            });
        }
        if call > 1 {
            let (class, stragglar, after_switch) = history[call as usize - 2];
            let (_, _, post) = records[call as usize - 2];
            if post != u64::from(POST_UNMEASURED) && !after_switch {
                times[class].add(stragglar, post);
            }
        }
    }
    assert!(on_stragglar > 800 && on_stragglar < 7200, "{on_stragglar}");
    assert!(measured.iter().all(|&m| m > 0), "{measured:?}");
    for (class, bytes) in sizes.iter().enumerate() {
        let device = &g.classes[size_class(*bytes) as usize];
        assert_eq!(device.calls, times[class].decided, "class of {bytes} B");
        assert_eq!(device.times.stragglar.taken, times[class].stragglar.taken());
        assert_eq!(device.times.baseline.taken, times[class].baseline.taken());
    }
}

#[test]
fn an_abort_during_a_replay_releases_every_rank_and_resets_the_graph_state() {
    // Rank 3 never launches its replay; the abort word, raised 50 ms in, must release the
    // three that did (no deadline set), each reporting the abort, and their graph state must
    // be left consistent: the blocks' counter back at 0 and the call counted.
    use stragglar::detect::policy::AlgoMode;
    let ranks = 4;
    let policy = slow_link_policy(ranks, AlgoMode::Stragglar);
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(ranks, 2, 2);
    comm.timeout_ns = 0;
    let config = stragglar::detect::DetectorConfig::default();
    let captured = Captured::new(&comm, &mut cache, &policy, config, 1000);
    let everyone: Vec<usize> = (0..ranks).collect();
    comm.replay(&captured.launches, &everyone, false);
    assert!((0..ranks).all(|r| comm.status(r) == STATUS_OK));
    let abort = comm.abort.addr() as usize;
    let started = Instant::now();
    scoped(|scope| {
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: the Comm's aligned abort word, which the kernels only read.
            unsafe { AtomicU32::from_ptr(abort as *mut u32) }.store(1, Ordering::Release);
        });
        comm.replay(&captured.launches, &[0, 1, 2], false);
    });
    assert!(started.elapsed() < Duration::from_secs(30));
    for r in 0..3 {
        assert_eq!(comm.status(r), STATUS_ABORTED, "rank {r}");
        let state = comm.graph_state(r);
        assert_eq!((state.calls, state.finished), (2, 0), "rank {r}");
    }
}

#[test]
fn graph_calls_on_nccls_turn_are_sampled_as_the_host_samples_eager_calls() {
    // The turn kernel's sample of graph calls whose end it notes is the host's sample of eager
    // calls (`measures`), bit for bit: one hash, two implementations.
    let k = kernel();
    for call in (0..200_000u64).chain([u64::MAX - 7, u64::MAX]) {
        // SAFETY: a pure function of its argument.
        let device = unsafe { (k.measures)(call) } == 1;
        assert_eq!(
            device,
            stragglar::gpu::arrival::measures(call),
            "call {call}"
        );
    }
}

#[test]
fn graph_choices_that_change_at_every_replay_stay_identical_on_every_rank() {
    // A detector that follows every record (a window of one, no dwell) under STRAGGLAR_ALGO=
    // stragglar: each replay runs StragglAR with the rank that was last two graph calls of its
    // class before, and a random rank is late at every replay, so the choice changes at most
    // replays. Two captured calls of different size classes; on odd replays the late rank's
    // arrival thread writes its verdict before its data blocks read theirs. Any replay reading a
    // verdict half that is being written, or a stale one, shows as a rank or a choice that
    // differs.
    use stragglar::detect::policy::AlgoMode;
    use stragglar::detect::{Choice, Detector, DetectorConfig};
    let ranks = 4;
    let policy = slow_link_policy(ranks, AlgoMode::Stragglar);
    let config = DetectorConfig {
        window: 1,
        on_fraction: 1.0,
        off_fraction: 1.0,
        min_dwell: 0,
    };
    let mut cache = PlanCache::default();
    let mut comm = Comm::new(ranks, 2, 2);
    let mut captured = [
        Captured::new(&comm, &mut cache, &policy, config, 2048),
        Captured::new(&comm, &mut cache, &policy, config, 200),
    ];
    let mut detectors = [0, 1].map(|_| Detector::new(ranks, config));
    let everyone: Vec<usize> = (0..ranks).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut random = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut classes = Vec::new();
    let mut changes = 0;
    let mut previous = None;
    for replay in 0..64u64 {
        let which = usize::from(random() % 3 == 0);
        comm.late = Some(((random() % 4) as usize, Duration::from_millis(3)));
        let choice = match policy.choose(&detectors[which], None, captured[which].bytes) {
            Choice::Stragglar { straggler } => straggler,
            Choice::Baseline => ranks,
        };
        changes += usize::from(previous.is_some_and(|p| p != choice));
        previous = Some(choice);
        classes.push(which);
        comm.replay(&captured[which].launches, &everyone, replay % 2 == 1);
        check_replay(&mut comm, &mut captured[which], replay, choice);
        if replay > 0 {
            detectors[classes[replay as usize - 1]].observe(graph_record(&comm, replay - 1));
        }
    }
    assert!(changes >= 20, "the choice changed only {changes} times");
}

/// Every plan block's share of a chunk, for the GPU's 32-lane arrival warp as for the
/// emulation's one thread: the shares tile the chunk in order (each element in exactly one
/// block; every boundary but the chunk's end on 16 bytes), and a block's share of whole units
/// follows its data threads (plan block 0 counts the warp out), within one unit either way.
#[test]
fn plan_blocks_share_each_chunk_by_their_data_threads() {
    let k = kernel();
    let share = |bytes: u64, b: u64, blocks: u64, threads: u64, lanes: u64| {
        let mut out = [0u64; 2];
        // SAFETY: `out` holds the two words the function writes.
        unsafe { (k.block_share)(bytes, b, blocks, threads, lanes, out.as_mut_ptr()) };
        (out[0], out[1])
    };
    let sizes = (0..=70u64)
        .chain([255, 4096, 65_535, 1 << 20, (1 << 26) + 7, 1 << 34])
        .collect::<Vec<_>>();
    for lanes in [1u64, 32] {
        for threads in [32u64, 64, 480, 512] {
            for blocks in [1u64, 2, 3, 8, 27, 32] {
                for &bytes in &sizes {
                    let mut next = 0;
                    let data = |b: u64| {
                        if b == 0 && threads > lanes {
                            threads - lanes
                        } else {
                            threads
                        }
                    };
                    let weights = blocks * threads - (data(0) != threads) as u64 * lanes;
                    let units = bytes.div_ceil(16);
                    for b in 0..blocks {
                        let (begin, end) = share(bytes, b, blocks, threads, lanes);
                        let case = format!(
                            "{bytes} B, block {b} of {blocks}, {threads} threads, {lanes} lanes"
                        );
                        assert_eq!(begin, next, "{case}: a gap or an overlap");
                        assert!(end >= begin && end <= bytes, "{case}: [{begin}, {end})");
                        assert!(begin % 16 == 0 && (end % 16 == 0 || end == bytes), "{case}");
                        let ideal = units as f64 * data(b) as f64 / weights as f64;
                        let got = (end.div_ceil(16) - begin / 16) as f64;
                        assert!(
                            (got - ideal).abs() < 1.0 + 1e-9,
                            "{case}: {got} units, ideally {ideal}"
                        );
                        next = end;
                    }
                    assert_eq!(
                        next, bytes,
                        "{bytes} B over {blocks} blocks: not all covered"
                    );
                }
            }
        }
    }
}
