// hami-decode: runs HAMi's own Go code (the module pinned in go.mod) on mthreads allocation records,
// so that tests/deploy/test_hami_decoder.py can check byte for byte that HAMi reads what mtsched books,
// and that mtsched's strict decoder accepts what HAMi writes.
//
// stdin: one JSON object a line; stdout: one JSON object a line, in the same order.
//
//	{"annotations": {...}, "init_containers": N, "containers": M}
//	  -> {"devices": [[{uuid,type,usedmem,usedcores}], ...] | null,   device.DecodePodDevices, per container
//	      "booked": [{uuid,usedmem,usedcores,slots}, ...],               device.CollapseInitContainerUsage
//	      "error": "..."}                                                 (what the scheduler's onAddPod books)
//	{"encode": [[{"idx","uuid","usedmem","usedcores"}], ...], "node": "n1"}
//	  -> {"annotations": {...}}   mthreads.PatchAnnotations (device.EncodePodSingleDevice + gpu-index)
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/device/mthreads"
	"github.com/Project-HAMi/HAMi/pkg/util"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

type grant struct {
	Idx       int    `json:"idx"`
	UUID      string `json:"uuid"`
	Type      string `json:"type,omitempty"`
	Usedmem   int32  `json:"usedmem"`
	Usedcores int32  `json:"usedcores"`
	Slots     int32  `json:"slots,omitempty"`
}

type request struct {
	Annotations    map[string]string `json:"annotations"`
	InitContainers int               `json:"init_containers"`
	Containers     int               `json:"containers"`
	Encode         [][]grant         `json:"encode"`
	Node           string            `json:"node"`
}

type reply struct {
	Devices     [][]grant         `json:"devices"`
	Booked      []grant           `json:"booked"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Error       string            `json:"error,omitempty"`
}

func grants(cd device.ContainerDevices) []grant {
	out := make([]grant, 0, len(cd))
	for _, d := range cd {
		out = append(out, grant{Idx: d.Idx, UUID: d.UUID, Type: d.Type, Usedmem: d.Usedmem, Usedcores: d.Usedcores,
			Slots: d.Slots})
	}
	return out
}

func decode(req request) reply {
	pod := &corev1.Pod{}
	pod.Annotations = req.Annotations
	pod.Spec.InitContainers = make([]corev1.Container, req.InitContainers)
	pod.Spec.Containers = make([]corev1.Container, req.Containers)
	raw, err := device.DecodePodDevices(device.SupportDevices, pod.Annotations)
	if err != nil {
		return reply{Error: err.Error()}
	}
	out := reply{Booked: []grant{}}
	if single, ok := raw[mthreads.MthreadsGPUDevice]; ok {
		out.Devices = [][]grant{}
		for _, cd := range single {
			out.Devices = append(out.Devices, grants(cd))
		}
	}
	for _, cd := range device.CollapseInitContainerUsage(pod, raw)[mthreads.MthreadsGPUDevice] {
		out.Booked = append(out.Booked, grants(cd)...)
	}
	return out
}

func encode(req request) reply {
	single := device.PodSingleDevice{}
	for _, ctr := range req.Encode {
		cd := device.ContainerDevices{}
		for _, g := range ctr {
			cd = append(cd, device.ContainerDevice{Idx: g.Idx, UUID: g.UUID, Type: mthreads.MthreadsGPUDevice,
				Usedmem: g.Usedmem, Usedcores: g.Usedcores})
		}
		single = append(single, cd)
	}
	annos := map[string]string{util.AssignedNodeAnnotations: req.Node}
	dev := mthreads.InitMthreadsDevice(mthreads.MthreadsConfig{})
	return reply{Annotations: dev.PatchAnnotations(&corev1.Pod{}, &annos,
		device.PodDevices{mthreads.MthreadsGPUDevice: single})}
}

func main() {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	mthreads.InitMthreadsDevice(mthreads.MthreadsConfig{
		ResourceCountName: "mthreads.com/vgpu", ResourceMemoryName: "mthreads.com/sgpu-memory",
		ResourceCoreName: "mthreads.com/sgpu-core"})

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var rep reply
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			rep = reply{Error: "bad request: " + err.Error()}
		} else if req.Encode != nil {
			rep = encode(req)
		} else {
			rep = decode(req)
		}
		if err := out.Encode(rep); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
