//! NCCL (or RCCL) loaded at run time with `libloading`.
//!
//! The crate must build and its CPU tests must run on machines with no CUDA, so NCCL is
//! never linked: [`Nccl::load`] opens the library when a multi-rank cell starts and
//! resolves the handful of calls a DDP/FSDP trainer needs. A missing library or symbol is
//! a typed [`NcclError`] naming what was tried, never a panic (cudarc 0.19 opens
//! `libnccl.so`, which the NCCL wheel does not ship, and panics when it is absent).
//!
//! Which library: the function argument when given, else `$BENCH_NCCL_LIB`, else NCCL's
//! soname `libnccl.so.2` and then RCCL's `librccl.so.1` (ROCm), resolved through the
//! dynamic loader (`LD_LIBRARY_PATH`; `scripts/env.sh` adds the wheel's `nvidia/nccl/lib`).
//!
//! Tensors cross this boundary as raw device pointers with an element count, an
//! [`DataType`] and a [`RedOp`], plus the CUDA/HIP stream as `*mut c_void` (null is the
//! default stream), so the trainer can pass a libtorch tensor's `data_ptr()` and the
//! current stream without this module knowing about libtorch.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::Arc;

/// NCCL's soname (the wheel `nvidia-nccl-cu*` ships exactly this file).
pub(crate) const NCCL_SONAME: &str = "libnccl.so.2";
/// RCCL's soname on ROCm.
pub(crate) const RCCL_SONAME: &str = "librccl.so.1";
/// Environment variable naming the library (a soname or a path).
pub(crate) const ENV_LIB: &str = "BENCH_NCCL_LIB";
/// Size of `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// Failures of loading NCCL or of one of its calls.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error("cannot load NCCL/RCCL: tried {}; {errors} (set {ENV_LIB} to the library's path)", tried.join(", "))]
    Load { tried: Vec<String>, errors: String },
    #[error(
        "{lib}: missing symbol `{symbol}` ({reason}); is this an NCCL >= 2.12 or RCCL library?"
    )]
    Symbol {
        lib: String,
        symbol: &'static str,
        reason: String,
    },
    #[error("{lib}: {call} failed with {code}: {message}")]
    Call {
        lib: String,
        call: &'static str,
        code: i32,
        message: String,
    },
    #[error("unique id must be {UNIQUE_ID_BYTES} bytes, got {0}")]
    BadUniqueId(usize),
    #[error("rank {rank} is outside a world of {world_size}")]
    BadRank { rank: u32, world_size: u32 },
}

/// `ncclDataType_t` (same numbering in NCCL and RCCL). All of nccl.h's values are named, so
/// the table reads as the header does, though the workload sends only some of them.
#[allow(dead_code)]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    /// NCCL >= 2.24 and recent RCCL only.
    Float8E4M3 = 10,
    /// NCCL >= 2.24 and recent RCCL only.
    Float8E5M2 = 11,
}

/// `ncclRedOp_t`, all of nccl.h's values (the workload reduces with some of them).
#[allow(dead_code)]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    /// NCCL >= 2.10.
    Avg = 4,
}

/// An NCCL version as `ncclGetVersion` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    /// Decodes `NCCL_VERSION_CODE`: `major*10000 + minor*100 + patch` since 2.9, and
    /// `major*1000 + minor*100 + patch` before (2.8.4 is 2804, 2.21.5 is 22105).
    pub(crate) fn from_code(code: i32) -> Version {
        let c = code.max(0) as u32;
        if c >= 10000 {
            Version {
                major: c / 10000,
                minor: (c % 10000) / 100,
                patch: c % 100,
            }
        } else {
            Version {
                major: c / 1000,
                minor: (c % 1000) / 100,
                patch: c % 100,
            }
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// `ncclUniqueId`: an opaque 128-byte blob that rank 0 creates and every rank passes to
/// [`Nccl::comm_init_rank`]; the rendezvous carries it between processes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; UNIQUE_ID_BYTES],
}

impl UniqueId {
    pub fn as_bytes(&self) -> &[u8] {
        &self.internal
    }

    pub(crate) fn from_bytes(b: &[u8]) -> Result<UniqueId, NcclError> {
        let internal: [u8; UNIQUE_ID_BYTES] =
            b.try_into().map_err(|_| NcclError::BadUniqueId(b.len()))?;
        Ok(UniqueId { internal })
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.internal[..8])
    }
}

type RawComm = *mut c_void;
type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type FnGetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type FnCommInitRank = unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> c_int;
type FnComm = unsafe extern "C" fn(RawComm) -> c_int;
type FnGetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> c_int;
type FnAllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, *mut c_void) -> c_int;
type FnBroadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> c_int;
type FnGroup = unsafe extern "C" fn() -> c_int;

/// The loaded library and its resolved entry points.
pub struct Nccl {
    name: String,
    get_version: FnGetVersion,
    get_unique_id: FnGetUniqueId,
    comm_init_rank: FnCommInitRank,
    comm_destroy: FnComm,
    comm_abort: FnComm,
    get_error_string: FnGetErrorString,
    all_reduce: FnAllReduce,
    reduce_scatter: FnAllReduce,
    all_gather: FnAllGather,
    broadcast: FnBroadcast,
    group_start: FnGroup,
    group_end: FnGroup,
    // Declared last so the function pointers above are never used after the library is
    // closed (fields drop in declaration order, and nothing reads them during drop).
    _lib: libloading::Library,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl").field("lib", &self.name).finish()
    }
}

/// The libraries [`Nccl::load`] tries, in order: the argument, else `$BENCH_NCCL_LIB`,
/// else NCCL's and RCCL's sonames.
pub(crate) fn candidates(arg: Option<&str>, env: Option<&str>) -> Vec<String> {
    match (arg, env) {
        (Some(a), _) if !a.is_empty() => vec![a.to_string()],
        (_, Some(e)) if !e.is_empty() => vec![e.to_string()],
        _ => vec![NCCL_SONAME.to_string(), RCCL_SONAME.to_string()],
    }
}

impl Nccl {
    /// Loads NCCL or RCCL (see [`candidates`]); `lib` is a soname or a path.
    pub fn load(lib: Option<&str>) -> Result<Arc<Nccl>, NcclError> {
        let env = std::env::var(ENV_LIB).ok();
        let tried = candidates(lib, env.as_deref());
        let mut errors = Vec::new();
        for name in &tried {
            // SAFETY: loading NCCL runs its initialisers, which only set up internal state;
            // the library is kept alive in the returned value for as long as any pointer
            // into it is used.
            match unsafe { libloading::Library::new(name.as_str()) } {
                Ok(l) => return Self::resolve(name.clone(), l).map(Arc::new),
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        Err(NcclError::Load {
            tried,
            errors: errors.join("; "),
        })
    }

    fn resolve(name: String, lib: libloading::Library) -> Result<Nccl, NcclError> {
        fn sym<T: Copy>(
            lib: &libloading::Library,
            name: &str,
            symbol: &'static str,
        ) -> Result<T, NcclError> {
            // SAFETY: each `T` below is the C signature of `symbol` from nccl.h (the same
            // in RCCL's rccl.h); the copied function pointer lives no longer than `lib`,
            // which `Nccl` owns.
            unsafe { lib.get::<T>(symbol) }
                .map(|s| *s)
                .map_err(|e| NcclError::Symbol {
                    lib: name.to_string(),
                    symbol,
                    reason: e.to_string(),
                })
        }
        let n = name.as_str();
        Ok(Nccl {
            get_version: sym(&lib, n, "ncclGetVersion")?,
            get_unique_id: sym(&lib, n, "ncclGetUniqueId")?,
            comm_init_rank: sym(&lib, n, "ncclCommInitRank")?,
            comm_destroy: sym(&lib, n, "ncclCommDestroy")?,
            comm_abort: sym(&lib, n, "ncclCommAbort")?,
            get_error_string: sym(&lib, n, "ncclGetErrorString")?,
            all_reduce: sym(&lib, n, "ncclAllReduce")?,
            reduce_scatter: sym(&lib, n, "ncclReduceScatter")?,
            all_gather: sym(&lib, n, "ncclAllGather")?,
            broadcast: sym(&lib, n, "ncclBroadcast")?,
            group_start: sym(&lib, n, "ncclGroupStart")?,
            group_end: sym(&lib, n, "ncclGroupEnd")?,
            name,
            _lib: lib,
        })
    }

    /// The soname or path the library was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The text NCCL gives for a result code.
    pub(crate) fn error_string(&self, code: i32) -> String {
        // SAFETY: ncclGetErrorString returns a pointer to a static, NUL-terminated string
        // (or null for codes it does not know, which is handled).
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("unknown NCCL result {code}");
        }
        // SAFETY: non-null and NUL-terminated, see above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, call: &'static str, code: c_int) -> Result<(), NcclError> {
        if code == 0 {
            Ok(())
        } else {
            Err(NcclError::Call {
                lib: self.name.clone(),
                call,
                code,
                message: self.error_string(code),
            })
        }
    }

    /// `ncclGetVersion`. Works without a GPU.
    pub fn version(&self) -> Result<Version, NcclError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        let rc = unsafe { (self.get_version)(&mut v) };
        self.check("ncclGetVersion", rc)?;
        Ok(Version::from_code(v))
    }

    /// `ncclGetUniqueId`: rank 0 calls it and shares the bytes through the rendezvous.
    /// Works without a GPU (it only opens NCCL's bootstrap socket).
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: writes 128 bytes into a 128-byte repr(C) struct.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", rc)?;
        Ok(id)
    }

    /// `ncclCommInitRank`: joins the communicator of `world_size` ranks. Blocks until all
    /// ranks have joined; the CUDA device must already be set for this thread.
    pub(crate) fn comm_init_rank(
        self: &Arc<Self>,
        world_size: u32,
        id: &UniqueId,
        rank: u32,
    ) -> Result<Comm, NcclError> {
        if rank >= world_size {
            return Err(NcclError::BadRank { rank, world_size });
        }
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: `raw` receives the new communicator; the id is passed by value as the C
        // signature requires.
        let rc =
            unsafe { (self.comm_init_rank)(&mut raw, world_size as c_int, *id, rank as c_int) };
        self.check("ncclCommInitRank", rc)?;
        Ok(Comm {
            nccl: Arc::clone(self),
            raw,
            rank,
            world_size,
        })
    }

    /// `ncclGroupStart`: collectives until [`Nccl::group_end`] are fused into one launch.
    pub(crate) fn group_start(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        self.check("ncclGroupStart", unsafe { (self.group_start)() })
    }

    /// `ncclGroupEnd`.
    pub(crate) fn group_end(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        self.check("ncclGroupEnd", unsafe { (self.group_end)() })
    }
}

/// A communicator. Dropping it without [`Comm::destroy`] aborts it (`ncclCommAbort`),
/// which never waits for peers, so an error path cannot hang in the destructor.
pub(crate) struct Comm {
    nccl: Arc<Nccl>,
    raw: RawComm,
    rank: u32,
    world_size: u32,
}

// SAFETY: an NCCL communicator may be used from any thread, one thread at a time; `Comm`
// is not `Sync`, so shared concurrent use is impossible.
unsafe impl Send for Comm {}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl Comm {
    /// `ncclCommDestroy`: orderly teardown after all work on the communicator finished.
    pub(crate) fn destroy(mut self) -> Result<(), NcclError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: `raw` is a live communicator, nulled above so Drop does not free it again.
        let rc = unsafe { (self.nccl.comm_destroy)(raw) };
        self.nccl.check("ncclCommDestroy", rc)
    }

    /// `ncclCommAbort`: tears down at once, cancelling operations still in flight (use it
    /// when a peer failed).
    pub(crate) fn abort(mut self) -> Result<(), NcclError> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: as in `destroy`.
        let rc = unsafe { (self.nccl.comm_abort)(raw) };
        self.nccl.check("ncclCommAbort", rc)
    }

    /// `ncclAllReduce` of `count` elements.
    ///
    /// # Safety
    /// `send` and `recv` must be device pointers (they may be equal, for in place) to at
    /// least `count` elements of `dtype`, valid until the work on `stream` completes;
    /// `stream` must be a stream of this rank's device, or null for the default stream.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn all_reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let rc = (self.nccl.all_reduce)(
            send,
            recv,
            count,
            dtype as c_int,
            op as c_int,
            self.raw,
            stream,
        );
        self.nccl.check("ncclAllReduce", rc)
    }

    /// `ncclReduceScatter`: `send` holds `recv_count * world_size` elements, `recv` gets
    /// this rank's reduced `recv_count`.
    ///
    /// # Safety
    /// As [`Comm::all_reduce`], with the sizes above.
    pub(crate) unsafe fn reduce_scatter(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: DataType,
        op: RedOp,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let rc = (self.nccl.reduce_scatter)(
            send,
            recv,
            recv_count,
            dtype as c_int,
            op as c_int,
            self.raw,
            stream,
        );
        self.nccl.check("ncclReduceScatter", rc)
    }

    /// `ncclAllGather`: every rank contributes `send_count` elements; `recv` gets
    /// `send_count * world_size`, in rank order.
    ///
    /// # Safety
    /// As [`Comm::all_reduce`], with the sizes above.
    pub(crate) unsafe fn all_gather(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let rc = (self.nccl.all_gather)(send, recv, send_count, dtype as c_int, self.raw, stream);
        self.nccl.check("ncclAllGather", rc)
    }

    /// `ncclBroadcast` of `count` elements from `root` (`send` is only read on the root).
    ///
    /// # Safety
    /// As [`Comm::all_reduce`].
    pub(crate) unsafe fn broadcast(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        root: u32,
        stream: *mut c_void,
    ) -> Result<(), NcclError> {
        let rc = (self.nccl.broadcast)(
            send,
            recv,
            count,
            dtype as c_int,
            root as c_int,
            self.raw,
            stream,
        );
        self.nccl.check("ncclBroadcast", rc)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: a live communicator owned by this value. Abort rather than destroy:
            // a drop on an error path must not wait for peers that may be gone.
            unsafe { (self.nccl.comm_abort)(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_both_encodings() {
        assert_eq!(Version::from_code(22105).to_string(), "2.21.5");
        assert_eq!(Version::from_code(22703).to_string(), "2.27.3");
        assert_eq!(Version::from_code(2804).to_string(), "2.8.4");
        assert_eq!(Version::from_code(2708).to_string(), "2.7.8");
        assert!(Version::from_code(21805) > Version::from_code(2804));
    }

    #[test]
    fn candidates_follow_argument_then_env_then_sonames() {
        assert_eq!(
            candidates(Some("/x/libnccl.so.2"), Some("y")),
            ["/x/libnccl.so.2"]
        );
        assert_eq!(candidates(None, Some("librccl.so.1")), ["librccl.so.1"]);
        assert_eq!(candidates(None, Some("")), [NCCL_SONAME, RCCL_SONAME]);
        assert_eq!(candidates(None, None), [NCCL_SONAME, RCCL_SONAME]);
    }

    #[test]
    fn missing_library_is_an_error_naming_what_was_tried() {
        let err = Nccl::load(Some("/nonexistent/libnccl-missing.so.2")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, NcclError::Load { .. }), "{err:?}");
        assert!(msg.contains("/nonexistent/libnccl-missing.so.2"), "{msg}");
        assert!(msg.contains(ENV_LIB), "{msg}");
    }

    #[test]
    fn library_without_nccl_symbols_is_a_symbol_error() {
        // libc is always loadable and has no NCCL entry points.
        let err = Nccl::load(Some("libc.so.6")).unwrap_err();
        match err {
            NcclError::Symbol { symbol, .. } => assert_eq!(symbol, "ncclGetVersion"),
            other => panic!("expected a symbol error, got {other:?}"),
        }
    }

    #[test]
    fn unique_id_round_trips_and_checks_length() {
        let b: Vec<u8> = (0..128u8).collect();
        assert_eq!(UniqueId::from_bytes(&b).unwrap().as_bytes(), &b[..]);
        assert!(matches!(
            UniqueId::from_bytes(&b[..127]),
            Err(NcclError::BadUniqueId(127))
        ));
    }
}
