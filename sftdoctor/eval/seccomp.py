"""The system calls a sandboxed sample may not make, written once and compiled two ways: a classic-BPF program
for bubblewrap's `--seccomp FD`, and a seccomp profile for `docker run --security-opt seccomp=FILE`.

Each refused call is refused because it reaches past the sandbox's walls (another process's memory or file
descriptors, the kernel keyring, which bubblewrap shares with the caller), escapes accounting (memfd pages
live outside RLIMIT_AS and the private /tmp), skips the filter itself (io_uring performs I/O without system
calls), or needs privileges the sample does not have anyway (mounts, modules), so refusing it costs nothing
and closes a kernel attack surface. The call fails with EPERM, as under Docker's default profile, except
clone3, which fails with ENOSYS so that glibc falls back to clone, whose flags a filter can read: a clone
that asks for a new namespace is refused.

Numbers are those of the kernel's uapi headers (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h),
pinned against the headers by a test where they are installed. Any other architecture gets no BPF program
(`program()` returns None and the sandbox reports that it runs unfiltered: `available()` says why).
"""

from __future__ import annotations

import errno
import platform
import struct

# name: (x86_64 number, aarch64 number, why it is refused)
REFUSED: dict[str, tuple[int, int, str]] = {
    "ptrace": (101, 117, "another process's registers and memory: bubblewrap's PID 1 runs with the sample's uid"),
    "process_vm_readv": (310, 270, "another process's memory"),
    "process_vm_writev": (311, 271, "another process's memory"),
    "pidfd_getfd": (438, 438, "another process's file descriptors (bubblewrap's exit-status eventfd)"),
    "kcmp": (312, 272, "compares another process's kernel objects"),
    "keyctl": (250, 219, "the kernel keyring, which bubblewrap hands through from the caller"),
    "add_key": (248, 217, "the kernel keyring"),
    "request_key": (249, 218, "the kernel keyring"),
    "io_uring_setup": (425, 425, "io_uring performs I/O that no system call filter sees"),
    "io_uring_enter": (426, 426, "io_uring"),
    "io_uring_register": (427, 427, "io_uring"),
    "memfd_create": (319, 279, "anonymous files outside RLIMIT_AS and the bounded /tmp"),
    "memfd_secret": (447, 447, "memory hidden from the kernel's own accounting"),
    "userfaultfd": (323, 282, "stalls the kernel on a page fault, a staple of kernel exploits"),
    "perf_event_open": (298, 241, "kernel performance counters"),
    "bpf": (321, 280, "loads programs into the kernel"),
    "unshare": (272, 97, "new namespaces"),
    "setns": (308, 268, "other namespaces"),
    "mount": (165, 40, "needs privileges the sample lacks"),
    "umount2": (166, 39, "needs privileges the sample lacks"),
    "pivot_root": (155, 41, "needs privileges the sample lacks"),
    "chroot": (161, 51, "needs privileges the sample lacks"),
    "open_tree": (428, 428, "the new mount API"),
    "move_mount": (429, 429, "the new mount API"),
    "fsopen": (430, 430, "the new mount API"),
    "fsconfig": (431, 431, "the new mount API"),
    "fsmount": (432, 432, "the new mount API"),
    "fspick": (433, 433, "the new mount API"),
    "mount_setattr": (442, 442, "the new mount API"),
    "name_to_handle_at": (303, 264, "file handles open files by inode, past the mount namespace"),
    "open_by_handle_at": (304, 265, "file handles open files by inode, past the mount namespace"),
    "kexec_load": (246, 104, "needs privileges the sample lacks"),
    "kexec_file_load": (320, 294, "needs privileges the sample lacks"),
    "init_module": (175, 105, "needs privileges the sample lacks"),
    "finit_module": (313, 273, "needs privileges the sample lacks"),
    "delete_module": (176, 106, "needs privileges the sample lacks"),
    "reboot": (169, 142, "needs privileges the sample lacks"),
    "swapon": (167, 224, "needs privileges the sample lacks"),
    "swapoff": (168, 225, "needs privileges the sample lacks"),
    "acct": (163, 89, "needs privileges the sample lacks"),
}
CLONE = (56, 220)
CLONE3 = (435, 435)
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: Docker's default profile's mask
CLONE_NAMESPACES = 0x7E020000

ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column in REFUSED, AUDIT_ARCH_*
X32_BIT = 0x40000000  # x32 system calls on x86_64 carry this bit: refused, or they would dodge the numbers

# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low word on little-endian machines)


def program(arch: str | None = None) -> bytes | None:
    """The filter as bubblewrap reads it (struct sock_filter[], native byte order), or None on an
    architecture this table does not know."""
    arch = arch or platform.machine()
    if arch not in ARCHES:
        return None
    column, audit_arch = ARCHES[arch]
    # (opcode, label if true, label if false, k): None falls through to the next instruction
    code: list[tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, _ARCH),
        (_JEQ_K, None, "kill", audit_arch),
        (_LD_W_ABS, None, None, _NR),
    ]
    labels: dict[str, int] = {}
    if arch == "x86_64":
        code.append((_JGE_K, "eperm", None, X32_BIT))
    code += [(_JEQ_K, "eperm", None, number) for number in sorted({n[column] for n in REFUSED.values()})]
    code += [
        (_JEQ_K, "enosys", None, CLONE3[column]),
        (_JEQ_K, None, "allow", CLONE[column]),
        (_LD_W_ABS, None, None, _ARG0),
        (_JSET_K, "eperm", "allow", CLONE_NAMESPACES),
    ]
    for label, action in (
        ("allow", _ALLOW),
        ("eperm", _ERRNO | errno.EPERM),
        ("enosys", _ERRNO | errno.ENOSYS),
        ("kill", _KILL_PROCESS),
    ):
        labels[label] = len(code)
        code.append((_RET_K, None, None, action))

    def jump(i: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - i - 1

    return b"".join(struct.pack("=HBBI", op, jump(i, jt), jump(i, jf), k) for i, (op, jt, jf, k) in enumerate(code))


def docker_profile() -> dict:
    """The same refusals as a Docker seccomp profile. It replaces Docker's default profile, so every other
    call is allowed; a clone with any namespace flag is refused (one rule per flag: rules are ORed)."""
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [
            {"names": sorted(REFUSED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            *(
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": errno.EPERM,
                    "args": [{"index": 0, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}],
                }
                for bit in _bits(CLONE_NAMESPACES)
            ),
        ],
    }


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(32) if mask >> i & 1]
