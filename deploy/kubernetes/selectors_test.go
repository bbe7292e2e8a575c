package kubernetes_test

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func metav1Selector(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

// selected are the Deployments whose pods a selector picks.
func selected(r *rendering, sel labels.Selector) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	for _, d := range r.deployments {
		if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

// checkSelectors checks that Services, PodDisruptionBudgets and autoscalers
// reach the Deployments they are for, that the gateways have all three, and
// that the brokers run at least two replicas under a budget.
func checkSelectors(r *rendering) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	budgeted := map[string]bool{}
	for _, p := range r.pdbs {
		sel, err := metav1Selector(p.Spec.Selector)
		if err != nil {
			fail("PodDisruptionBudget %s: %v", p.Name, err)
			continue
		}
		ds := selected(r, sel)
		if len(ds) == 0 {
			fail("PodDisruptionBudget %s selects no Deployment's pods", p.Name)
		}
		for _, d := range ds {
			budgeted[d.Name] = true
		}
	}
	served := map[string]bool{}
	for _, s := range r.services {
		ds := selected(r, labels.SelectorFromSet(s.Spec.Selector))
		if len(ds) == 0 {
			fail("Service %s selects no Deployment's pods", s.Name)
		}
		for _, d := range ds {
			served[d.Name] = true
			for _, p := range s.Spec.Ports {
				if _, ok := containerPort(&d.Spec.Template.Spec, p.TargetPort); !ok {
					fail("Service %s: targetPort %s is no port of Deployment %s", s.Name, p.TargetPort.String(), d.Name)
				}
			}
		}
	}
	scaled := map[string]bool{}
	for _, h := range r.hpas {
		t := h.Spec.ScaleTargetRef
		if t.Kind != "Deployment" || !slices.ContainsFunc(r.deployments, func(d *appsv1.Deployment) bool { return d.Name == t.Name }) {
			fail("HorizontalPodAutoscaler %s scales %s %s, which is not in the rendering", h.Name, t.Kind, t.Name)
		}
		if !slices.ContainsFunc(h.Spec.Metrics, func(m autoscalingv2.MetricSpec) bool { return m.Resource != nil && m.Resource.Name == "cpu" }) {
			fail("HorizontalPodAutoscaler %s does not scale on CPU", h.Name)
		}
		scaled[t.Name] = true
	}
	for _, d := range r.deployments {
		switch sub := subcommand(d); sub {
		case "gateway":
			if !budgeted[d.Name] || !served[d.Name] || !scaled[d.Name] {
				fail("gateway Deployment %s: a PodDisruptionBudget %v, a Service %v, an autoscaler %v", d.Name, budgeted[d.Name], served[d.Name], scaled[d.Name])
			}
		case "broker":
			if !budgeted[d.Name] || d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
				fail("broker Deployment %s: at least 2 replicas under a PodDisruptionBudget", d.Name)
			}
		}
	}
	return errs
}

// subcommand is what the Deployment's switchyard container runs ("" when
// none runs one).
func subcommand(d *appsv1.Deployment) string {
	for _, c := range d.Spec.Template.Spec.Containers {
		if isSwitchyard(&c) && len(c.Args) > 0 {
			if c.Args[0] == "adapter" {
				continue // beside an engine
			}
			return c.Args[0]
		}
	}
	return ""
}
