package kubernetes_test

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// scaleVerbs are what the loader's kubernetes action needs on
// deployments/scale: it PATCHes the scale subresource
// (loader/kubernetes.go); get and update are what `kubectl scale` and
// client tooling use on the same subresource.
var scaleVerbs = []string{"get", "patch", "update"}

// checkLoaderRBAC checks that every pod running `switchyard loader` runs as
// a ServiceAccount of the rendering, with its token mounted, bound in its
// namespace to a Role of the rendering that grants the scale verbs on
// deployments/scale in the apps group.
func checkLoaderRBAC(r *rendering) []error {
	var errs []error
	for _, d := range r.deployments {
		spec := &d.Spec.Template.Spec
		if !slices.ContainsFunc(allContainers(spec), func(c *corev1.Container) bool {
			return isSwitchyard(c) && len(c.Args) > 0 && c.Args[0] == "loader"
		}) {
			continue
		}
		fail := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("Deployment "+d.Name+": "+format, a...))
		}
		sa := spec.ServiceAccountName
		if sa == "" || sa == "default" {
			fail("the loader runs as the namespace's default ServiceAccount; give it its own (serviceAccountName)")
			continue
		}
		i := slices.IndexFunc(r.accounts, func(a *corev1.ServiceAccount) bool { return a.Name == sa && a.Namespace == d.Namespace })
		if i < 0 {
			fail("ServiceAccount %q is not in the rendering", sa)
			continue
		}
		if off := spec.AutomountServiceAccountToken; off != nil && !*off {
			fail("automountServiceAccountToken is false: the kubernetes action has no token")
		} else if off := r.accounts[i].AutomountServiceAccountToken; spec.AutomountServiceAccountToken == nil && off != nil && !*off {
			fail("ServiceAccount %s does not mount its token and the pod does not ask for it", sa)
		}
		bound, granted := false, false
		for _, b := range r.bindings {
			if b.Namespace != d.Namespace || !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
				return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == d.Namespace
			}) {
				continue
			}
			bound = true
			if b.RoleRef.APIGroup != rbacv1.GroupName || b.RoleRef.Kind != "Role" {
				fail("RoleBinding %s refers to %s %s of group %q, want a Role of %s", b.Name, b.RoleRef.Kind, b.RoleRef.Name, b.RoleRef.APIGroup, rbacv1.GroupName)
				continue
			}
			j := slices.IndexFunc(r.roles, func(ro *rbacv1.Role) bool { return ro.Name == b.RoleRef.Name && ro.Namespace == b.Namespace })
			if j < 0 {
				fail("RoleBinding %s refers to Role %q, which is not in the rendering", b.Name, b.RoleRef.Name)
				continue
			}
			if missing := missingVerbs(r.roles[j], "apps", "deployments/scale", scaleVerbs); len(missing) > 0 {
				fail("Role %s does not grant %v on apps deployments/scale", r.roles[j].Name, missing)
				continue
			}
			granted = true
		}
		switch {
		case !bound:
			fail("no RoleBinding binds its ServiceAccount %q: the kubernetes action's scale calls would be forbidden", sa)
		case !granted:
			fail("no Role bound to ServiceAccount %q grants %v on deployments/scale", sa, scaleVerbs)
		}
	}
	return errs
}

// missingVerbs are the verbs of want that no rule of ro grants on resource
// of group. A rule limited to resourceNames does not count: the routing
// table may name any Deployment of the namespace.
func missingVerbs(ro *rbacv1.Role, group, resource string, want []string) []string {
	var missing []string
	for _, v := range want {
		if !slices.ContainsFunc(ro.Rules, func(p rbacv1.PolicyRule) bool {
			return matches(p.APIGroups, group) && matches(p.Resources, resource) && matches(p.Verbs, v) && len(p.ResourceNames) == 0
		}) {
			missing = append(missing, v)
		}
	}
	return missing
}

func matches(list []string, v string) bool {
	return slices.Contains(list, v) || slices.Contains(list, "*")
}
