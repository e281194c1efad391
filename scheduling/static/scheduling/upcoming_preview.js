// The periodic task form's "Preview" button: posts the unsaved form to the upcoming-runs preview
// view (the admin's own URL, with the form's CSRF token) and shows the table it returns. The
// slots are computed on the server by the scheduler's slot code; nothing is saved.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
    const box = document.getElementById("upcoming-preview");
    const button = document.getElementById("upcoming-preview-button");
    if (!box || !button) {
        return;
    }
    button.addEventListener("click", async function () {
        const form = button.closest("form");
        const data = new FormData(form);
        box.setAttribute("aria-busy", "true");
        try {
            const response = await fetch(box.dataset.url, {
                method: "POST",
                body: data,
                credentials: "same-origin",
                headers: {"X-CSRFToken": data.get("csrfmiddlewaretoken")},
            });
            box.innerHTML = await response.text();
        } catch (error) {
            box.textContent = "The preview could not be loaded: " + error;
        } finally {
            box.removeAttribute("aria-busy");
        }
    });
});
