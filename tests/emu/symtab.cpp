/*
 * symtab.cpp - a kernel's static __shared__ arrays, found in the symbol
 * table (tests/emu, issue 23).
 *
 * In the emulator `__shared__` is `static`, so a kernel's shared arrays are
 * its function-local statics. To poison them before every block the emulator
 * needs their addresses, and a declaration prefix cannot register anything.
 * GCC's section attribute would gather them, but it drops the attribute on
 * the statics of template instantiations, which is what most kernels are. The
 * names, though, are fixed by the Itanium C++ ABI: the statics of a function
 * whose mangled name is _Z<encoding> are _ZZ<encoding>E<name>. So the
 * emulator reads the symbol table of the object that holds the kernel (the
 * executable, /proc/self/exe, or a shared library), finds the kernel's name
 * from its address, and takes every writable object whose name starts with
 * that prefix. CUDA allows no other statics in a __global__ function, and
 * read-only ones (__func__) are skipped. A binary without a symbol table
 * (stripped) is reported once and its statics are not poisoned.
 */
#include "emu.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace zr_emu {

namespace {

struct object_syms {
    std::unordered_map<uintptr_t, std::string> funcs;       /* address -> mangled name */
    std::vector<std::pair<std::string, shared_var>> locals; /* _ZZ... writable, by name */
};

struct find_arg {
    uintptr_t addr;
    std::string path;
    uintptr_t bias;
    bool found;
};

int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    find_arg *a = static_cast<find_arg *>(data);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && a->addr >= lo && a->addr < lo + ph.p_memsz) {
            a->path = info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' ? info->dlpi_name
                                                                               : "/proc/self/exe";
            a->bias = info->dlpi_addr;
            a->found = true;
            return 1;
        }
    }
    return 0;
}

bool read_symbols(const std::string &path, uintptr_t bias, object_syms *out)
{
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(ElfW(Ehdr))) {
        close(fd);
        return false;
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        return false;
    }
    const char *base = static_cast<const char *>(map);
    const ElfW(Ehdr) *eh = reinterpret_cast<const ElfW(Ehdr) *>(base);
    bool ok = false;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_shoff != 0 &&
        eh->e_shoff + (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) <= len) {
        const ElfW(Shdr) *sh = reinterpret_cast<const ElfW(Shdr) *>(base + eh->e_shoff);
        for (unsigned int i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) {
                continue;
            }
            const ElfW(Shdr) &strs = sh[sh[i].sh_link];
            if (sh[i].sh_offset + sh[i].sh_size > len || strs.sh_offset + strs.sh_size > len) {
                break;
            }
            const ElfW(Sym) *sym = reinterpret_cast<const ElfW(Sym) *>(base + sh[i].sh_offset);
            size_t nsym = sh[i].sh_size / sizeof(ElfW(Sym));
            const char *names = base + strs.sh_offset;
            for (size_t k = 0; k < nsym; k++) {
                if (sym[k].st_name >= strs.sh_size || sym[k].st_shndx == SHN_UNDEF ||
                    sym[k].st_shndx >= eh->e_shnum) {
                    continue;
                }
                const char *name = names + sym[k].st_name;
                int type = ELF64_ST_TYPE(sym[k].st_info);
                uintptr_t addr = bias + sym[k].st_value;
                if (type == STT_FUNC && sym[k].st_value != 0) {
                    out->funcs.emplace(addr, name);
                } else if (type == STT_OBJECT && strncmp(name, "_ZZ", 3) == 0 &&
                           sym[k].st_size > 0) {
                    const ElfW(Shdr) &sec = sh[sym[k].st_shndx];
                    if ((sec.sh_flags & SHF_WRITE) && !(sec.sh_flags & SHF_TLS)) {
                        out->locals.push_back(std::make_pair(
                            std::string(name),
                            shared_var{reinterpret_cast<void *>(addr), (size_t)sym[k].st_size}));
                    }
                }
            }
            ok = true;
            break;
        }
    }
    munmap(map, len);
    std::sort(out->locals.begin(), out->locals.end(),
              [](const std::pair<std::string, shared_var> &a,
                 const std::pair<std::string, shared_var> &b) { return a.first < b.first; });
    return ok;
}

/* "_ZZ" + the function's encoding + "E": the names of its local statics */
std::string statics_prefix(const std::string &fn)
{
    if (fn.compare(0, 2, "_Z") == 0) {
        return "_ZZ" + fn.substr(2) + "E";
    }
    return "_ZZ" + std::to_string(fn.size()) + fn + "E"; /* extern "C" */
}

std::mutex g_mu;
std::map<std::string, object_syms *> g_objects;
std::unordered_map<const void *, std::vector<shared_var> *> g_cache;

} // namespace

const std::vector<shared_var> &static_shared_of(const void *kernel)
{
    std::lock_guard<std::mutex> lock(g_mu);
    auto hit = g_cache.find(kernel);
    if (hit != g_cache.end()) {
        return *hit->second;
    }
    auto *vars = new std::vector<shared_var>;
    g_cache[kernel] = vars;
    find_arg a{(uintptr_t)kernel, "", 0, false};
    dl_iterate_phdr(find_object, &a);
    if (!a.found) {
        return *vars;
    }
    object_syms *syms = g_objects[a.path];
    if (syms == nullptr) {
        syms = new object_syms;
        g_objects[a.path] = syms;
        if (!read_symbols(a.path, a.bias, syms)) {
            fprintf(stderr,
                    "zr-emu: warning: %s has no symbol table: static __shared__ memory is not "
                    "poisoned between blocks\n",
                    a.path.c_str());
        }
    }
    auto fn = syms->funcs.find((uintptr_t)kernel);
    if (fn == syms->funcs.end()) {
        return *vars;
    }
    std::string prefix = statics_prefix(fn->second);
    auto it = std::lower_bound(syms->locals.begin(), syms->locals.end(), prefix,
                               [](const std::pair<std::string, shared_var> &v,
                                  const std::string &p) { return v.first < p; });
    for (; it != syms->locals.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        vars->push_back(it->second);
    }
    return *vars;
}

} // namespace zr_emu
