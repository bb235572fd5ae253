//! Recognising a CUBIN: an ELF64 file for the CUDA machine whose flags name the architecture
//! it was built for, holding the kernels of one of our modules. Used to validate cache entries
//! and by the tests.

/// `e_machine` of CUDA device code.
const EM_CUDA: u16 = 190;

/// The SM version (`80` for sm_80) a CUBIN's ELF flags name: the low byte under ELF ABI
/// version 7 (NVRTC 12.9 writes `0x500550` for sm_80), the second byte under ABI version 8
/// (NVRTC 13.2 writes `0x6005a04` for sm_90).
fn sm_of(abi_version: u8, flags: u32) -> u32 {
    if abi_version >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    }
}

/// Checks that `bytes` is a CUBIN for `arch` (`sm_90`, ...) containing each of `kernels` (a
/// module's: `kernels::MODULE_KERNELS` or `kernels::TURN_MODULE_KERNELS`).
pub fn check(bytes: &[u8], arch: &str, kernels: &[&str]) -> Result<(), String> {
    let want: u32 = arch
        .strip_prefix("sm_")
        .map(|v| v.trim_end_matches(['a', 'f']))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{arch} is not an sm_XX architecture"))?;
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err("not a little-endian ELF64 file".into());
    }
    let machine = u16::from_le_bytes([bytes[18], bytes[19]]);
    if machine != EM_CUDA {
        return Err(format!("ELF machine {machine}, not CUDA ({EM_CUDA})"));
    }
    let flags = u32::from_le_bytes(bytes[48..52].try_into().expect("4 bytes"));
    let sm = sm_of(bytes[8], flags);
    if sm != want {
        return Err(format!("built for sm_{sm}, not {arch}"));
    }
    for kernel in kernels {
        let name = kernel.as_bytes();
        if !bytes.windows(name.len()).any(|w| w == name) {
            return Err(format!("no {kernel} inside"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::kernels::{
        ALL_REDUCE_KERNEL, APPLY_PROBE_KERNEL, MODULE_KERNELS, TURN_MODULE_KERNELS,
    };

    fn fake(abi: u8, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[8] = abi;
        b[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
        b[48..52].copy_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(ALL_REDUCE_KERNEL.as_bytes());
        b.extend_from_slice(APPLY_PROBE_KERNEL.as_bytes());
        b
    }

    #[test]
    fn both_flag_layouts_are_read() {
        // The flags NVRTC 12.9 and 13.2 actually wrote.
        assert!(check(&fake(7, 0x0050_0550), "sm_80", &MODULE_KERNELS).is_ok());
        assert!(check(&fake(7, 0x005a_055a), "sm_90", &MODULE_KERNELS).is_ok());
        assert!(check(&fake(8, 0x0600_5004), "sm_80", &MODULE_KERNELS).is_ok());
        assert!(check(&fake(8, 0x0600_5a04), "sm_90", &MODULE_KERNELS).is_ok());
        assert!(check(&fake(8, 0x0600_5a04), "sm_80", &MODULE_KERNELS).is_err());
        assert!(check(&fake(7, 0x0050_0550), "sm_90", &MODULE_KERNELS).is_err());
        // The turn kernel's module must hold the turn kernel.
        assert!(check(&fake(7, 0x005a_055a), "sm_90", &TURN_MODULE_KERNELS).is_err());
        assert!(check(
            b"not an elf at all, not even close to sixty-four bytes long......",
            "sm_80",
            &MODULE_KERNELS
        )
        .is_err());
    }
}
