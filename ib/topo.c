/* topo.c — topology detection with hwloc (CPUs, NUMA nodes, NVIDIA GPUs and
 * RDMA HCAs on the PCI bus) and the strata-topo reports (topo.h). */
#include "ib/topo.h"

#include <hwloc.h>
#include <string.h>

#define PCI_VENDOR_NVIDIA 0x10de

/* The NUMA node an I/O object is attached to: the nodeset of its first
 * non-I/O ancestor when that is exactly one node, else -1. */
static int io_numa(hwloc_topology_t topo, hwloc_obj_t obj)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);
    if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
    return hwloc_bitmap_first(anc->nodeset);
}

static void fill_pci(topo_pci *p, hwloc_topology_t topo, hwloc_obj_t pci, const char *name)
{
    memset(p, 0, sizeof *p);
    const struct hwloc_pcidev_attr_s *a = &pci->attr->pcidev;
    snprintf(p->busid, sizeof p->busid, "%04x:%02x:%02x.%x", (unsigned)a->domain, (unsigned)a->bus,
             (unsigned)a->dev, (unsigned)a->func);
    snprintf(p->name, sizeof p->name, "%s", name ? name : p->busid);
    p->vendor = a->vendor_id;
    p->device = a->device_id;
    p->numa = io_numa(topo, pci);
}

int topo_detect(topo_info *out, st_err *err)
{
    memset(out, 0, sizeof *out);
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return st_errf(err, "topo: hwloc_topology_init failed");
    /* Keep PCI devices and OS devices (GPUs, HCAs), drop bridges we do not need. */
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) != 0) {
        hwloc_topology_destroy(topo);
        return st_errf(err, "topo: hwloc_topology_load failed");
    }
    out->n_packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    out->n_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    out->n_pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn && out->n_numa < TOPO_MAX_NUMA; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        topo_numa *n = &out->numa[out->n_numa++];
        n->os_index = o->os_index;
        n->memory_bytes = o->attr ? o->attr->numanode.local_memory : 0;
        n->n_pus = o->cpuset ? hwloc_get_nbobjs_inside_cpuset_by_type(topo, o->cpuset, HWLOC_OBJ_PU) : 0;
        if (!o->cpuset || hwloc_bitmap_iszero(o->cpuset)) snprintf(n->cpus, sizeof n->cpus, "none");
        else hwloc_bitmap_list_snprintf(n->cpus, sizeof n->cpus, o->cpuset);
    }
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_pcidev(topo, o));) {
        const struct hwloc_pcidev_attr_s *a = &o->attr->pcidev;
        if (a->vendor_id == PCI_VENDOR_NVIDIA && (a->class_id >> 8) == 0x03 && out->n_gpus < TOPO_MAX_PCI)
            fill_pci(&out->gpus[out->n_gpus++], topo, o, NULL);
    }
    for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(topo, o));) {
        if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || !o->name || out->n_hcas == TOPO_MAX_PCI) continue;
        hwloc_obj_t pci = o->parent;
        while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
        topo_pci *h = &out->hcas[out->n_hcas++];
        if (pci) fill_pci(h, topo, pci, o->name);
        else {
            memset(h, 0, sizeof *h);
            snprintf(h->name, sizeof h->name, "%s", o->name);
            h->numa = io_numa(topo, o);
        }
    }
    hwloc_topology_destroy(topo);
    return 0;
}

int topo_hca_numa(const topo_info *t, const char *name)
{
    for (int i = 0; i < t->n_hcas; i++)
        if (!strcmp(t->hcas[i].name, name)) return t->hcas[i].numa;
    return -1;
}

static void print_numa_of(FILE *f, int numa)
{
    if (numa >= 0) fprintf(f, ", NUMA node %d", numa);
    else fprintf(f, ", NUMA node unknown");
}

int topo_print(FILE *f, const topo_info *t, const rdma_device *devs, int n, const fabric_env *fabric,
               st_err *err)
{
    fprintf(f, "cpus: %d logical CPUs, %d cores, %d package%s\n", t->n_pus, t->n_cores, t->n_packages,
            t->n_packages == 1 ? "" : "s");
    fprintf(f, "numa: %d node%s\n", t->n_numa, t->n_numa == 1 ? "" : "s");
    for (int i = 0; i < t->n_numa; i++)
        fprintf(f, "  node %u: %d CPUs (%s), %.1f GiB\n", t->numa[i].os_index, t->numa[i].n_pus, t->numa[i].cpus,
                (double)t->numa[i].memory_bytes / (double)(1ull << 30));
    if (t->n_gpus == 0) fprintf(f, "gpus: none (no NVIDIA device on the PCI bus)\n");
    else fprintf(f, "gpus: %d NVIDIA\n", t->n_gpus);
    for (int i = 0; i < t->n_gpus; i++) {
        fprintf(f, "  gpu %d: %s [%04x:%04x]", i, t->gpus[i].busid, t->gpus[i].vendor, t->gpus[i].device);
        print_numa_of(f, t->gpus[i].numa);
        fputc('\n', f);
    }
    if (n == 0) fprintf(f, "rdma: no RDMA device (UCX will use TCP or shared memory)\n");
    else fprintf(f, "rdma: %d device%s\n", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++)
        for (int p = 0; p < devs[i].n_ports; p++) {
            const rdma_port *rp = &devs[i].ports[p];
            fprintf(f, "  %s port %d: %s, %s", devs[i].name, rp->num, rp->active ? "active" : "down",
                    rp->ethernet ? "Ethernet (RoCE)" : "InfiniBand");
            if (rp->ethernet) fprintf(f, ", RoCE v2 GID index %d", rp->roce_v2_gid);
            print_numa_of(f, topo_hca_numa(t, devs[i].name));
            fputc('\n', f);
        }
    fprintf(f, "fabric:\n");
    fabric_env_print(f, fabric);
    return 0;
}
